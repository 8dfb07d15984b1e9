"""Bundled example models (a Triton-layout model repository under ``repository/``).

Rebuild them with ``python -m inferd.examples.build_models`` (needs the ``dev`` extra).
"""

from pathlib import Path

#: The bundled example model repository shipped with the package.
REPOSITORY = Path(__file__).resolve().parent / "repository"
