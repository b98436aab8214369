"""Plug-in parameters from outside: ``--set`` flags and the [params.PLUGIN] tables of presets and
config files (a plug-in's own defaults are merged by _specs.merge_params)."""
from __future__ import annotations

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: the same parser, packaged as tomli
    import tomli as tomllib

from ._validate_config import _params
from .algorithms import ALGORITHMS
from .augmenters import AUGMENTERS


def plugin_class(plugin: str) -> tuple[str, type]:
    """("algorithm" | "augmenter", that plug-in's class: its ``defaults`` and ``params``) of a
    plug-in name; unknown names raise, listing the known ones."""
    if plugin in ALGORITHMS:
        return "algorithm", ALGORITHMS[plugin]
    if plugin in AUGMENTERS:
        return "augmenter", AUGMENTERS[plugin]
    raise ValueError(f"{plugin!r} is neither an algorithm nor an augmenter; algorithms: "
                     f"{', '.join(sorted(ALGORITHMS))}; augmenters: {', '.join(sorted(AUGMENTERS))}")


def _scalar(text: str):
    """A --set value as a TOML scalar (512, 0.01, 1e-5, inf, true, "1/D"); text that is no TOML
    value (an unquoted string such as 1/D or median) is taken as that string."""
    try:
        v = tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text
    if isinstance(v, (dict, list)):
        raise ValueError(f"--set takes one value (number, true/false or string), got {text!r}")
    return v


def parse_set(items: list[str] | None) -> dict[str, dict]:
    """``--set PLUGIN.KEY=VALUE`` flags -> {plugin: {key: value}}. The plug-in is an algorithm or
    augmenter name and the key one of its ``defaults``; anything else is an error naming the flag
    and the known names."""
    out: dict[str, dict] = {}
    for item in items or []:
        name, eq, value = item.partition("=")
        plugin, dot, key = name.strip().partition(".")
        if not eq or not dot or not plugin or not key or not value.strip():
            raise ValueError(f"--set {item!r}: expected PLUGIN.KEY=VALUE, e.g. --set fedmc.n_base=512 or "
                             "--set fedprox.mu=0.01")
        plugin, key = plugin.lower(), key.strip()
        try:
            kind, cls = plugin_class(plugin)
        except ValueError as exc:
            raise ValueError(f"--set {item}: {exc}") from None
        defaults = cls.defaults
        if key not in defaults:
            raise ValueError(f"--set {item}: {kind} {plugin!r} has no parameter {key!r}; it takes "
                             f"{', '.join(sorted(defaults)) or 'none'}")
        out.setdefault(plugin, {})[key] = _scalar(value.strip())
    for plugin, table in out.items():  # type and range of each value, naming the flag
        kind, cls = plugin_class(plugin)
        _params(f"--set {plugin}", table, cls.defaults, cls.params, f"{kind} {plugin!r}")
    return out


def check_params_table(params, where: str) -> dict[str, dict]:
    """A ``[params.PLUGIN]`` table of a preset or config file: known plug-ins and keys only."""
    if not isinstance(params, dict):
        raise ValueError(f"{where}: params must be a table of [params.PLUGIN] tables, got {params!r}")
    for plugin, table in params.items():
        try:
            kind, cls = plugin_class(plugin)
        except ValueError as exc:
            raise ValueError(f"{where}: [params.{plugin}]: {exc}") from None
        defaults = cls.defaults
        if not isinstance(table, dict):
            raise ValueError(f"{where}: params.{plugin} must be a table of {kind} parameters, got {table!r}")
        unknown = sorted(set(table) - set(defaults))
        if unknown:
            raise ValueError(f"{where}: [params.{plugin}] has unknown key(s) {unknown}; {kind} {plugin!r} takes "
                             f"{', '.join(sorted(defaults)) or 'none'}")
    return params


def apply_params(methods, params: dict[str, dict], *, override: bool, source: str = "") -> None:
    """Give every method that uses plug-in P the parameters ``params[P]`` (in place).
    ``override``: they replace the method's own values (``--set``); otherwise a method's own
    ``algorithm_params`` / ``augmenter_params`` win (a preset's or config file's [params]).
    With ``source`` (the flag), a plug-in no method uses is an error naming it."""
    for plugin, table in params.items():
        kind, _ = plugin_class(plugin)
        users = [m for m in methods if (m.algorithm.lower() if kind == "algorithm" else m.augmenter) == plugin]
        if not users and source:
            key, value = next(iter(table.items()))
            raise ValueError(f"{source} {plugin}.{key}={value}: no method uses the {kind} {plugin!r} "
                             f"(methods: {', '.join(m.name for m in methods)}); add it with "
                             f"--{'algorithms' if kind == 'algorithm' else 'augmenters'}")
        for m in users:
            attr = f"{kind}_params"
            own = getattr(m, attr)
            setattr(m, attr, {**own, **table} if override else {**table, **own})
