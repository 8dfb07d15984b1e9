"""The core every front end talks to: which models exist, their state, and where requests go."""

from __future__ import annotations

import asyncio
import logging
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from inferd import __version__
from inferd.config.model_config import read_config
from inferd.core.errors import ModelLoadError, NotFound, Unavailable
from inferd.core.model import Model
from inferd.repository.repository import ModelSource, scan

log = logging.getLogger("inferd.server")

#: The protocol extensions the server metadata advertises.
EXTENSIONS = ["binary_tensor_data", "statistics", "model_configuration", "schedule_policy"]


@dataclass
class ModelSlot:
    """Everything known about one model name: its served versions, or why it has none."""

    name: str
    versions: dict[str, Model] = field(default_factory=dict)
    latest: Model | None = None
    state: str = "UNAVAILABLE"
    reason: str = ""


class InferenceServer:
    """Loads the repositories and hands out models; owns nothing of any wire protocol."""

    def __init__(self, repositories: list[Path], strict_readiness: bool = True) -> None:
        self.repositories = repositories
        self.strict_readiness = strict_readiness
        self.models: dict[str, ModelSlot] = {}
        self.loop: asyncio.AbstractEventLoop | None = None
        self.live = True
        self.accepting = False
        self.loaded = False

    # -- lifecycle ---------------------------------------------------------------------------
    async def start(self) -> None:
        """Load every model in the repositories; a model that fails is reported, not fatal."""
        self.loop = asyncio.get_running_loop()
        sources, problems = scan(self.repositories)
        for name, reason in problems.items():
            log.error("%s", reason)
            self.models[name] = ModelSlot(name, reason=reason)
        with ThreadPoolExecutor(max_workers=4, thread_name_prefix="inferd-load") as pool:
            tasks = [self.loop.run_in_executor(pool, self._load_source, src) for src in sources.values()]
            for slot in await asyncio.gather(*tasks):
                self.models[slot.name] = slot
        for slot in self.models.values():
            for model in slot.versions.values():
                model.start(self.loop)
            if slot.latest is not None:
                slot.state = "READY"
                log.info("successfully loaded '%s' version %s", slot.name, slot.latest.version)
        self.loaded = True
        self.accepting = True

    def _load_source(self, source: ModelSource) -> ModelSlot:
        slot = ModelSlot(source.name)
        try:
            config, found = read_config(source.path)
            if not source.versions:
                raise ModelLoadError(f"model '{source.name}' has no version folder in {source.path}")
            version = source.versions[-1]
            model = Model(config, version, source.path / str(version))
            model.load(found)
        except ModelLoadError as exc:
            slot.reason = str(exc)
            log.error("failed to load '%s': %s", source.name, exc)
            return slot
        except Exception as exc:  # anything else a broken model throws: report it, keep serving
            slot.reason = f"model '{source.name}' failed to load: {exc!r}"
            log.exception("failed to load '%s'", source.name)
            return slot
        slot.versions[model.version_str] = model
        slot.latest = model
        return slot

    def stop(self) -> None:
        self.accepting = False
        for slot in self.models.values():
            for model in slot.versions.values():
                model.stop()
            slot.state = "UNAVAILABLE"
            slot.reason = "server stopped"

    # -- queries -----------------------------------------------------------------------------
    @property
    def ready(self) -> bool:
        if not (self.loaded and self.accepting):
            return False
        if self.strict_readiness:
            return all(slot.state == "READY" for slot in self.models.values())
        return True

    def model(self, name: str, version: str | None = None) -> Model:
        """The model version to serve; NotFound or Unavailable (with the load failure) otherwise."""
        slot = self.models.get(name)
        if slot is None:
            raise NotFound(f"unknown model: '{name}'")
        if not version:
            if slot.latest is None:
                raise Unavailable(f"model '{name}' is not ready: {slot.reason or 'no version loaded'}")
            return slot.latest
        model = slot.versions.get(version)
        if model is None:
            raise NotFound(f"unknown model: '{name}' version {version}")
        return model

    def metadata(self) -> dict[str, Any]:
        return {"name": "inferd", "version": __version__, "extensions": EXTENSIONS}

    def model_metadata(self, name: str, version: str | None) -> dict[str, Any]:
        model = self.model(name, version)
        versions = sorted(self.models[name].versions, key=int)
        return model.metadata(versions)

    def model_ready(self, name: str, version: str | None) -> bool:
        slot = self.models.get(name)
        if slot is None:
            raise NotFound(f"unknown model: '{name}'")
        if version:
            if version not in slot.versions:
                raise NotFound(f"unknown model: '{name}' version {version}")
            return slot.versions[version].state == "READY"
        return slot.latest is not None and slot.latest.state == "READY"

    def statistics(self, name: str | None, version: str | None) -> dict[str, Any]:
        if name:
            slot = self.models.get(name)
            if slot is None:
                raise NotFound(f"unknown model: '{name}'")
            if version:
                models = [self.model(name, version)]
            else:
                models = list(slot.versions.values())
                if not models:
                    raise Unavailable(f"model '{name}' is not ready: {slot.reason}")
        else:
            models = [m for slot in self.models.values() for m in slot.versions.values()]
        return {"model_stats": [m.stats.to_dict(m.name, m.version_str) for m in models]}

    def index(self) -> list[dict[str, Any]]:
        """The repository index: every model with its state (Triton's repository extension)."""
        rows: list[dict[str, Any]] = []
        for name in sorted(self.models):
            slot = self.models[name]
            if slot.versions:
                for version, model in sorted(slot.versions.items(), key=lambda kv: int(kv[0])):
                    rows.append({"name": name, "version": version, "state": model.state, "reason": model.reason})
            else:
                rows.append({"name": name, "state": slot.state, "reason": slot.reason})
        return rows
