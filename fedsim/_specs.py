"""Moved to fedsim/config.py (MethodSpec, default_methods, CENTRALISED, slug, merge_params); this
name stays only until every import has moved."""
from .config import CENTRALISED, MethodSpec, default_methods, merge_params, slug  # noqa: F401
