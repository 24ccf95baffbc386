"""KL to the reference policy: its coefficient and control, the estimator, and where the penalty goes."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated

from ..algorithms import KL_CONTROLLERS, KL_KINDS
from .applies import KL_ADAPTIVE, KL_CONTROLLED, KL_ON, KL_PID, _help, one_of, raise_first_failed


@dataclass
class KLFields:
    kl_coef: float = field(default=0.0, metadata=_help("KL(actor || reference) coefficient (its start value for "
                                                       "adaptive/pid control); 0 loads no reference."))
    kl_controller: Annotated[str, KL_ON] = field(default="fixed", metadata=_help("KL coefficient control: fixed, adaptive (Ziegler et "
                                                               "al. 2019) or pid; the controlled value is logged."))
    kl_target: Annotated[float, KL_CONTROLLED] = field(default=0.1, metadata=_help("Target KL per token for adaptive/pid control."))
    kl_horizon: Annotated[int, KL_ADAPTIVE] = field(default=10000, metadata=_help("Adaptive control horizon, in samples."))
    kl_pid_gains: Annotated[list[float] | None, KL_PID] = field(default=None, metadata=_help("kp ki kd of the pid controller."))
    kl_kind: Annotated[str, KL_ON] = field(default="k3", metadata=_help(f"KL estimator: {KL_KINDS} (a trailing '+' = straight-through)."))
    use_kl_in_reward: Annotated[bool, KL_ON] = field(
        default=False, metadata=_help("True: subtract kl_coef * KL from token rewards (PPO-style); False: KL loss term.")
    )


def check_kl(cfg) -> None:
    one_of("kl_kind", cfg.kl_kind.rstrip("+"), KL_KINDS)
    one_of("kl_controller", cfg.kl_controller, KL_CONTROLLERS)
    raise_first_failed(cfg, [
        ("kl_coef", cfg.kl_coef >= 0, "must be >= 0"),
        ("kl_target", cfg.kl_target > 0, "must be > 0"),
        ("kl_horizon", cfg.kl_horizon > 0, "must be > 0"),
        ("kl_pid_gains", cfg.kl_controller != "pid" or (cfg.kl_pid_gains is not None and len(cfg.kl_pid_gains) == 3),
         "must be three numbers (kp ki kd) when kl_controller='pid'"),
    ])
