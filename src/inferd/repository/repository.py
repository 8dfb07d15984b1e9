"""Model repositories in Triton's layout: ``<repo>/<model>/config.pbtxt`` and ``<repo>/<model>/<version>/``."""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class ModelSource:
    """Where one model lives: its folder and the numeric version folders in it."""

    name: str
    path: Path
    versions: tuple[int, ...]


def scan(repositories: list[Path]) -> tuple[dict[str, ModelSource], dict[str, str]]:
    """Find the models in the repositories.

    Returns the models found and, separately, the names that cannot be served with the reason
    (a name present in two repositories is ambiguous, as in Triton).
    """
    found: dict[str, ModelSource] = {}
    problems: dict[str, str] = {}
    seen_in: dict[str, Path] = {}
    for repo in repositories:
        if not repo.is_dir():
            raise FileNotFoundError(f"model repository {repo} is not a directory")
        for entry in sorted(repo.iterdir()):
            if not entry.is_dir() or entry.name.startswith("."):
                continue
            name = entry.name
            if name in seen_in:
                problems[name] = f"model '{name}' appears in two repositories: {seen_in[name]} and {repo}"
                found.pop(name, None)
                continue
            seen_in[name] = repo
            versions = tuple(sorted(int(v.name) for v in entry.iterdir() if v.is_dir() and v.name.isdigit()))
            found[name] = ModelSource(name, entry, versions)
    return found, problems


def read_source(name: str, path: Path) -> ModelSource:
    """The model folder as it is now (its version folders re-read)."""
    versions = tuple(sorted(int(v.name) for v in path.iterdir() if v.is_dir() and v.name.isdigit()))
    return ModelSource(name, path, versions)


def fingerprint(path: Path) -> tuple:
    """What a poll compares to decide that a model changed: every file's path, size and mtime,
    and the contents of config.pbtxt (a rewrite within one mtime tick still counts)."""
    entries: list[tuple] = []
    try:
        for root, dirs, files in os.walk(path):
            dirs.sort()
            rel = os.path.relpath(root, path)
            entries.append((rel, "dir"))
            for name in sorted(files):
                full = os.path.join(root, name)
                try:
                    st = os.stat(full)
                except OSError:
                    continue
                entries.append((os.path.join(rel, name), st.st_size, st.st_mtime_ns))
        config = path / "config.pbtxt"
        if config.is_file():
            entries.append(("config.pbtxt contents", hashlib.sha1(config.read_bytes()).hexdigest()))
    except OSError:
        pass
    return tuple(entries)
