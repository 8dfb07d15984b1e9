"""Model repositories in Triton's layout: ``<repo>/<model>/config.pbtxt`` and ``<repo>/<model>/<version>/``."""

from __future__ import annotations

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
