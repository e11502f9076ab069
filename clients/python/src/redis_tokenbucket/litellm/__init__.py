"""Rate limits for LiteLLM's proxy: requests, tokens and requests in
flight per virtual key, user, team, end user and model group, plus a cap
per model for the whole deployment, decided once per request in Redis
and exact across every proxy instance that shares it.

In the proxy's config.yaml::

    litellm_settings:
      callbacks: ["redis_tokenbucket.litellm.hook"]
    environment_variables:
      TB_LITELLM_RULES: /etc/litellm/rate-limits.yaml

`hook` is built when the proxy first asks for it (the rules are read and
checked then, so a bad rules file stops the proxy at start, naming the
file and the field): from the file named by TB_LITELLM_RULES, else from
the `redis_tokenbucket` section of the proxy's own config.yaml.
"""

from __future__ import annotations

import os
from typing import Any

from ._hook import TokenBucketHook
from ._rules import Limits, Rules, RulesError, load, parse

__all__ = ["Limits", "Rules", "RulesError", "TokenBucketHook", "from_env", "hook", "load", "parse"]

RULES_ENV = "TB_LITELLM_RULES"
SECTION = "redis_tokenbucket"

_built: dict[str, TokenBucketHook] = {}


def from_env() -> TokenBucketHook:
    """The hook the environment describes: the rules file named by
    TB_LITELLM_RULES, else the `redis_tokenbucket` section of the proxy's
    config.yaml (CONFIG_FILE_PATH, or the file the proxy loaded)."""
    path = os.environ.get(RULES_ENV)
    if path:
        return TokenBucketHook(load(path))
    config = os.environ.get("CONFIG_FILE_PATH") or _proxy_config_path()
    if not config:
        raise RulesError(f"no rules: set {RULES_ENV} to a rules file, or add a {SECTION} section to config.yaml")
    import yaml  # type: ignore[import-untyped, unused-ignore]

    try:
        with open(config) as f:
            section = (yaml.safe_load(f) or {}).get(SECTION)
    except (OSError, yaml.YAMLError) as exc:
        raise RulesError(f"{config}: can't read the proxy's config: {exc}") from None
    if section is None:
        raise RulesError(f"{config}: no {SECTION} section, and {RULES_ENV} is not set")
    return TokenBucketHook(parse(section, f"{config}: {SECTION}"))


def _proxy_config_path() -> Any:
    from litellm.proxy import proxy_server  # type: ignore[import-not-found, unused-ignore]

    return getattr(proxy_server, "user_config_file_path", None)


def __getattr__(name: str) -> Any:
    # The instance config.yaml names, built on first access: importing the
    # package reads no file.
    if name == "hook":
        if "hook" not in _built:
            _built["hook"] = from_env()
        return _built["hook"]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
