"""Write the Triton user's MNIST repository (seed 004) next to this file: ``model_repository/``.

The model is inferd's bundled digits CNN exported with a fixed batch of 1, the way the user's
``convert.py`` exported theirs; the config is theirs, verbatim.
"""

from pathlib import Path

from inferd.examples.build_models import write_seed_repository

if __name__ == "__main__":
    model_dir = write_seed_repository(Path(__file__).resolve().parent / "model_repository")
    print(f"wrote {model_dir}")
    print((model_dir / "config.pbtxt").read_text())
