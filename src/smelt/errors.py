"""Errors a user can cause. The CLI turns them into exit code 2 and a one-paragraph message."""


class UserError(Exception):
    """Bad input: a config key, a path or a data record. The message names it and says how to fix it."""


class ConfigError(UserError):
    """A config file or override that cannot be used."""
