"""Paper presets: TOML configuration files shipped inside the package (``fedsim presets`` lists
them, ``fedsim presets NAME`` prints one, ``fedsim run --preset NAME`` runs with it).

A preset is a configuration file like ``--config``'s: top-level RunConfig keys, optional
``[[methods]]`` tables, and ``[params.PLUGIN]`` tables of algorithm or augmenter hyper-parameters
that apply to every method using that plug-in (as ``--set PLUGIN.KEY=VALUE`` does). Its first
comment line is its one-line description. Precedence: RunConfig defaults < preset < ``--config``
file < flags (``--rounds`` ..., ``--set``).
"""
from __future__ import annotations

from importlib import resources


def _files() -> dict:
    return {f.name[:-5]: f for f in resources.files(__name__).iterdir() if f.name.endswith(".toml")}


def names() -> list[str]:
    return sorted(_files())


def text(name: str) -> str:
    files = _files()
    if name not in files:
        raise ValueError(f"no preset named {name!r} (--preset, fedsim presets); the presets are "
                         f"{', '.join(sorted(files))}")
    return files[name].read_text(encoding="utf-8")


def describe(name: str) -> str:
    """The preset's first comment line."""
    for line in text(name).splitlines():
        if line.startswith("#"):
            return line.lstrip("#").strip()
    return ""


def load(name: str) -> dict:
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib

    return tomllib.loads(text(name))
