"""The core every front end talks to: which models exist, their state, and where requests go.

Model control follows Triton's ``--model-control-mode``: ``none`` loads every model at start,
``poll`` also rescans the repositories every ``poll_secs`` and loads, reloads or unloads what
changed, ``explicit`` loads only what ``load_models`` names and then what the repository API asks
for. A reload builds the new versions completely, swaps them in (a request is routed by a lookup
on the event loop, so no request ever sees half a swap), then stops the old versions once their
in-flight requests are done.
"""

from __future__ import annotations

import asyncio
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from inferd import __version__
from inferd.config.model_config import ModelConfig, parse_config_text, read_config
from inferd.core.errors import InvalidRequest, ModelLoadError, NotFound, Unavailable
from inferd.core.model import Model
from inferd.core.shared_memory import SharedMemoryRegistry
from inferd.repository.repository import ModelSource, fingerprint, read_source, scan

log = logging.getLogger("inferd.server")

#: The protocol extensions the server metadata advertises.
EXTENSIONS = [
    "binary_tensor_data",
    "statistics",
    "model_configuration",
    "schedule_policy",
    "model_repository",
    "system_shared_memory",
]

CONTROL_MODES = ("none", "poll", "explicit")


@dataclass
class ModelSlot:
    """Everything known about one model name: its served versions, or why it has none."""

    name: str
    versions: dict[str, Model] = field(default_factory=dict)
    latest: Model | None = None
    state: str = "UNAVAILABLE"
    reason: str = ""
    #: versions that the policy selected but that failed to load, with why
    failed: dict[str, str] = field(default_factory=dict)
    #: where the model lives (None: no longer in any repository, or ambiguous)
    source: ModelSource | None = None
    #: the repository's files when this slot was last (re)loaded (poll mode compares it)
    fingerprint: tuple | None = None


@dataclass
class _Built:
    """The result of loading one model off the event loop (nothing started yet)."""

    versions: dict[str, Model] = field(default_factory=dict)
    failed: dict[str, str] = field(default_factory=dict)
    reason: str = ""
    fingerprint: tuple | None = None


def select_versions(config: ModelConfig, available: tuple[int, ...]) -> tuple[list[int], list[int]]:
    """The versions ``version_policy`` serves (Triton's rules) and the specific ones that are missing."""
    policy = config.version_policy
    choice = policy.WhichOneof("policy_choice")
    if choice == "all":
        return list(available), []
    if choice == "specific":
        wanted = sorted(set(policy.specific.versions))
        return [v for v in wanted if v in available], [v for v in wanted if v not in available]
    count = policy.latest.num_versions if choice == "latest" else 1
    if count < 1:
        raise ModelLoadError(f"model '{config.name}': version_policy latest needs num_versions >= 1")
    return list(available[-count:]), []


class InferenceServer:
    """Loads the repositories and hands out models; owns nothing of any wire protocol."""

    def __init__(
        self,
        repositories: list[Path],
        strict_readiness: bool = True,
        control_mode: str = "none",
        load_models: list[str] | None = None,
        poll_secs: float = 15.0,
        drain_timeout: float = 30.0,
    ) -> None:
        if control_mode not in CONTROL_MODES:
            raise ValueError(f"unknown model control mode '{control_mode}' (use one of {', '.join(CONTROL_MODES)})")
        self.repositories = repositories
        self.strict_readiness = strict_readiness
        self.control_mode = control_mode
        self.load_models = list(load_models or [])
        self.poll_secs = poll_secs
        self.drain_timeout = drain_timeout
        self.models: dict[str, ModelSlot] = {}
        #: the names that should be loaded (readiness waits for these)
        self.wanted: set[str] = set()
        self.loop: asyncio.AbstractEventLoop | None = None
        self.live = True
        self.accepting = False
        self.loaded = False
        self._pool: ThreadPoolExecutor | None = None
        self._locks: dict[str, asyncio.Lock] = {}
        self._poll_task: asyncio.Task | None = None
        #: versions swapped out and waiting for their in-flight requests (stopped at shutdown too)
        self._retiring: set[Model] = set()
        #: registered system shared memory regions (used on the event loop)
        self.shared_memory = SharedMemoryRegistry()

    # -- lifecycle ---------------------------------------------------------------------------
    async def start(self) -> None:
        """Load the models the control mode asks for; a model that fails is reported, not fatal."""
        self.loop = asyncio.get_running_loop()
        self._pool = ThreadPoolExecutor(max_workers=4, thread_name_prefix="inferd-load")
        sources, problems = scan(self.repositories)
        self._sync(sources, problems)
        if self.control_mode == "explicit":
            names: list[str] = []
            for name in self.load_models:
                if name == "*":
                    names.extend(sources)
                elif name in sources:
                    names.append(name)
                else:
                    log.error("--load-model %s: no model of that name in the model repositories", name)
            names = list(dict.fromkeys(names))
            self.wanted.update(names)
        else:
            if self.load_models:
                log.warning(
                    "--load-model is ignored with --model-control-mode %s (every model is loaded)", self.control_mode
                )
            names = list(sources)
            self.wanted.update(sources)
            self.wanted.update(problems)
        await asyncio.gather(*(self._load(name) for name in names))
        self.loaded = True
        self.accepting = True
        if self.control_mode == "poll":
            self._poll_task = self.loop.create_task(self._poll())

    def _sync(self, sources: dict[str, ModelSource], problems: dict[str, str]) -> None:
        """Bring the slots in line with a scan: new names get an (unloaded) slot, names that are
        gone lose their source (and their slot, unless a version is still served)."""
        for name, reason in problems.items():
            slot = self.models.setdefault(name, ModelSlot(name))
            slot.source = None
            if not slot.versions:
                if slot.reason != reason:
                    log.error("%s", reason)
                slot.state, slot.reason, slot.failed = "UNAVAILABLE", reason, {}
        for name, source in sources.items():
            slot = self.models.get(name)
            if slot is None:
                slot = self.models[name] = ModelSlot(name, reason="unloaded")
            elif slot.source is None and not slot.versions and slot.state != "LOADING":
                slot.reason = "unloaded"  # was ambiguous or gone; now it is here again
            slot.source = source
        for name in [n for n in self.models if n not in sources and n not in problems]:
            slot = self.models[name]
            slot.source = None
            if not slot.versions and slot.state != "LOADING" and name not in self._locks_held():
                del self.models[name]

    def _locks_held(self) -> set[str]:
        return {name for name, lock in self._locks.items() if lock.locked()}

    def _lock(self, name: str) -> asyncio.Lock:
        lock = self._locks.get(name)
        if lock is None:
            lock = self._locks[name] = asyncio.Lock()
        return lock

    async def _rescan(self) -> dict[str, ModelSource]:
        assert self.loop is not None
        sources, problems = await self.loop.run_in_executor(self._pool, scan, self.repositories)
        self._sync(sources, problems)
        return sources

    async def _load(self, name: str, override: ModelConfig | None = None) -> str:
        """(Re)load one model: build off the loop, swap in, retire the old versions.
        Returns "" on success, otherwise why nothing new serves."""
        assert self.loop is not None
        async with self._lock(name):
            slot = self.models.get(name)
            if slot is None or slot.source is None:
                return slot.reason if slot is not None else f"unknown model: '{name}'"
            if not slot.versions:
                slot.state, slot.reason, slot.failed = "LOADING", "", {}
            built = await self.loop.run_in_executor(self._pool, self._build, slot.source, override)
            if not built.versions:
                reason = built.reason or next(iter(built.failed.values()), "no version loaded")
                if slot.versions:  # a failed reload: what serves keeps serving
                    log.error("failed to reload '%s' (the loaded versions keep serving): %s", name, reason)
                    slot.fingerprint = built.fingerprint
                    return reason
            old = list(slot.versions.values())
            for model in built.versions.values():
                model.start(self.loop)
            slot.versions = built.versions
            slot.failed = built.failed
            slot.fingerprint = built.fingerprint
            slot.latest = max(built.versions.values(), key=lambda m: m.version) if built.versions else None
            if slot.latest is not None:
                slot.state, slot.reason = "READY", ""
                log.info("successfully loaded '%s' version(s) %s", name, ", ".join(sorted(built.versions, key=int)))
            else:
                slot.state = "UNAVAILABLE"
                slot.reason = built.reason or next(iter(built.failed.values()), "no version loaded")
            await self._retire(old)
            return "" if slot.latest is not None else slot.reason

    def _build(self, source: ModelSource, override: ModelConfig | None) -> _Built:
        """Blocking (in the load pool): read the config and load every version its policy selects."""
        name = source.name
        built = _Built(fingerprint=fingerprint(source.path))
        try:
            source = read_source(name, source.path)
            if override is not None:
                config, found = override, True
            else:
                config, found = read_config(source.path)
            if not source.versions:
                raise ModelLoadError(f"model '{name}' has no version folder in {source.path}")
            selected, missing = select_versions(config, source.versions)
            if not selected and not missing:
                raise ModelLoadError(
                    f"model '{name}': version_policy selects none of the versions {list(source.versions)}"
                )
        except ModelLoadError as exc:
            built.reason = str(exc)
            log.error("failed to load '%s': %s", name, exc)
            return built
        except Exception as exc:  # anything else a broken model throws: report it, keep serving
            built.reason = f"model '{name}' failed to load: {exc!r}"
            log.exception("failed to load '%s'", name)
            return built
        for version in missing:
            built.failed[str(version)] = (
                f"model '{name}' version {version}: version_policy names it but {source.path / str(version)} does not exist"
            )
            log.error("failed to load '%s': %s", name, built.failed[str(version)])
        for version in selected:
            copy = ModelConfig()
            copy.CopyFrom(config)
            model = Model(copy, version, source.path / str(version))
            try:
                model.load(found)
            except ModelLoadError as exc:
                built.failed[str(version)] = str(exc)
                log.error("failed to load '%s' version %d: %s", name, version, exc)
            except Exception as exc:
                built.failed[str(version)] = f"model '{name}' failed to load: {exc!r}"
                log.exception("failed to load '%s' version %d", name, version)
            else:
                built.versions[model.version_str] = model
        return built

    async def _retire(self, models: list[Model]) -> None:
        """Stop versions no longer routed to, once their in-flight requests are done (bounded)."""
        if not models:
            return
        self._retiring.update(models)
        deadline = time.monotonic() + self.drain_timeout
        try:
            while any(m.inflight > 0 for m in models) and time.monotonic() < deadline:
                await asyncio.sleep(0.01)
        finally:
            self._retiring.difference_update(models)
        for model in models:
            if model.state == "UNAVAILABLE":  # stopped already (the server is shutting down)
                continue
            if model.inflight:
                log.warning(
                    "'%s' version %s: %d request(s) still in flight after %.0fs; stopping it",
                    model.name,
                    model.version,
                    model.inflight,
                    self.drain_timeout,
                )
            model.stop()

    async def _unload(self, name: str) -> None:
        async with self._lock(name):
            self.wanted.discard(name)
            slot = self.models.get(name)
            if slot is None:
                return
            old = list(slot.versions.values())
            slot.versions, slot.failed, slot.latest, slot.fingerprint = {}, {}, None, None
            slot.state, slot.reason = "UNAVAILABLE", "unloaded"
            if old:
                log.info("unloading '%s'", name)
            await self._retire(old)
            if slot.source is None and self.models.get(name) is slot:
                del self.models[name]

    # -- model control (the repository API) ---------------------------------------------------
    def _check_control(self, what: str) -> None:
        if self.control_mode == "none":
            raise InvalidRequest(
                f"failed to {what}: model control is disabled (--model-control-mode none): every model is "
                "loaded at start-up; start the server with --model-control-mode explicit to load and unload "
                "models through the repository API"
            )
        if self.control_mode == "poll":
            raise InvalidRequest(
                f"failed to {what}: explicit model load / unload is not allowed with --model-control-mode poll "
                "(the repository is polled for changes); use --model-control-mode explicit"
            )

    async def load_model(self, name: str, parameters: dict[str, Any] | None = None) -> None:
        """Load (or reload) a model on request; raises InvalidRequest with why it failed."""
        self._check_control(f"load '{name}'")
        parameters = parameters or {}
        files = sorted(k for k in parameters if k.startswith("file:"))
        if files:
            raise InvalidRequest(
                f"failed to load '{name}': model files in the load request ({', '.join(files)}) are not "
                "supported by inferd; put the files in the model repository (a 'config' override alone is supported)"
            )
        override: ModelConfig | None = None
        text = parameters.get("config")
        if text is not None:
            if isinstance(text, bytes):
                text = text.decode("utf-8", "replace")
            if not isinstance(text, str):
                raise InvalidRequest(f"failed to load '{name}': the 'config' parameter must be a string")
            try:
                override = parse_config_text(text, name)
            except ModelLoadError as exc:
                raise InvalidRequest(f"failed to load '{name}': {exc}") from None
            if override.name != name:
                raise InvalidRequest(f"failed to load '{name}': the config override names model '{override.name}'")
        sources = await self._rescan()
        if name not in sources:
            slot = self.models.get(name)
            why = (
                slot.reason
                if slot is not None and slot.reason and slot.reason != "unloaded"
                else (
                    f"no model named '{name}' in the model repositories ({', '.join(str(r) for r in self.repositories)})"
                )
            )
            raise InvalidRequest(f"failed to load '{name}': {why}")
        self.wanted.add(name)
        reason = await self._load(name, override)
        if reason:
            raise InvalidRequest(f"failed to load '{name}': {reason}")

    async def unload_model(self, name: str) -> None:
        self._check_control(f"unload '{name}'")
        if name not in self.models:
            await self._rescan()
        if name not in self.models:
            raise InvalidRequest(f"failed to unload '{name}': unknown model")
        await self._unload(name)

    # -- poll mode -------------------------------------------------------------------------
    async def _poll(self) -> None:
        while True:
            await asyncio.sleep(self.poll_secs)
            try:
                await self.poll_once()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("polling the model repositories failed")

    async def poll_once(self) -> None:
        """One poll: load new models, reload changed ones, unload removed ones."""
        assert self.loop is not None
        sources, problems = await self.loop.run_in_executor(self._pool, scan, self.repositories)
        prints = await self.loop.run_in_executor(
            self._pool, lambda: {n: fingerprint(s.path) for n, s in sources.items()}
        )
        self._sync(sources, problems)
        self.wanted = set(sources) | set(problems)
        jobs = []
        for name in sources:
            slot = self.models[name]
            if self._lock(name).locked():
                continue
            if slot.fingerprint is None or slot.fingerprint != prints[name]:
                log.info(
                    "model '%s' %s in the repository; loading", name, "changed" if slot.fingerprint else "appeared"
                )
                jobs.append(self._load(name))
        for name, slot in list(self.models.items()):
            if slot.source is None and slot.versions:
                log.info("model '%s' was removed from the repository; unloading", name)
                jobs.append(self._unload(name))
        if jobs:
            await asyncio.gather(*jobs)

    def stop(self) -> None:
        self.accepting = False
        if self._poll_task is not None:
            self._poll_task.cancel()
        for slot in self.models.values():
            for model in slot.versions.values():
                model.stop()
            slot.state = "UNAVAILABLE"
            slot.reason = "server stopped"
        for model in list(self._retiring):
            if model.state != "UNAVAILABLE":
                model.stop()
        self._retiring.clear()
        if self._pool is not None:
            self._pool.shutdown(wait=False)

    # -- queries -----------------------------------------------------------------------------
    @property
    def ready(self) -> bool:
        if not (self.loaded and self.accepting):
            return False
        if self.strict_readiness:
            return all(slot.state == "READY" for name, slot in self.models.items() if name in self.wanted)
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
            if version in slot.failed:
                raise Unavailable(f"model '{name}' version {version} is not ready: {slot.failed[version]}")
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
            if version in slot.failed:
                return False
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

    def index(self, ready_only: bool = False) -> list[dict[str, Any]]:
        """The repository index: every model in the repositories with its state, per version
        (Triton's repository extension); models not loaded show as UNAVAILABLE "unloaded"."""
        if self.control_mode == "explicit" and self.loaded:
            try:  # explicit mode has no poller: show what the repositories hold now
                self._sync(*scan(self.repositories))
            except OSError as exc:
                log.warning("rescanning the model repositories failed: %s", exc)
        rows: list[dict[str, Any]] = []
        for name in sorted(self.models):
            slot = self.models[name]
            if slot.versions or slot.failed:
                for version in sorted({*slot.versions, *slot.failed}, key=int):
                    model = slot.versions.get(version)
                    if model is not None:
                        rows.append({"name": name, "version": version, "state": model.state, "reason": model.reason})
                    else:
                        rows.append(
                            {"name": name, "version": version, "state": "UNAVAILABLE", "reason": slot.failed[version]}
                        )
            else:
                rows.append({"name": name, "state": slot.state, "reason": slot.reason})
        if ready_only:
            rows = [row for row in rows if row["state"] == "READY"]
        return rows
