"""Settings: what a component reads from the config, declared by the component as a small frozen dataclass.

A component takes its settings, not the whole `VerlConfig`: its fields say what it depends on, and nothing
else reaches it. `Settings.of(config)` builds one from anything with those attributes (a `VerlConfig`, whose
derived properties such as `prompts_per_round` count too), once, when the trainer is built; a field whose
type is itself a Settings class is built the same way from the same config.

    settings = RoundSettings.of(args)      # at set-up
    RoundBuilder(settings, actor, ...)     # the component keeps only these values

See it work: tests/test_round.py.
"""

from __future__ import annotations

import dataclasses
import typing


@dataclasses.dataclass(frozen=True)
class Settings:
    @classmethod
    def of(cls, config):
        hints = typing.get_type_hints(cls)
        values = {}
        for f in dataclasses.fields(cls):
            kind = hints[f.name]
            nested = isinstance(kind, type) and issubclass(kind, Settings)
            values[f.name] = kind.of(config) if nested else getattr(config, f.name)
        return cls(**values)
