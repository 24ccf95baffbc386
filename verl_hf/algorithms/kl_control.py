"""KL coefficient controllers: fixed, adaptive (Ziegler et al. 2019) and PID.

A controller holds ``.value``, the coefficient beta of the KL(actor || reference) penalty, and
``update(current_kl, n_steps)`` moves it after each step from the measured KL.  Plain Python floats
only.  ``state_dict()`` / ``load_state_dict()`` capture every field, so a resumed run continues
with exactly the coefficient (and PID memory) it had when the checkpoint was written.

See it work: tests/test_kl_control.py
"""

import math
from typing import Any, Dict, Optional

KL_CONTROLLERS = ("adaptive", "fixed", "pid")


def _finite(name: str, x) -> float:
    """float(x), or ValueError for nan/inf: one bad KL reading must not poison the coefficient for good."""
    x = float(x)
    if not math.isfinite(x):
        raise ValueError(f"{name} must be finite, got {x}")
    return x


def _check_kind(d: Dict[str, Any], kind: str) -> None:
    if d.get("kind") != kind:
        raise ValueError(f"state_dict is for a {d.get('kind')!r} KL controller, not {kind!r}")


class FixedKLController:
    """Constant coefficient.  ``update`` does nothing.

    Formula: beta_{k+1} = beta_k.
    """

    kind = "fixed"

    def __init__(self, kl_coef: float):
        self.value = _finite("kl_coef", kl_coef)

    def update(self, current_kl: float = 0.0, n_steps: int = 1) -> None:
        """No-op (arguments accepted for interface parity)."""

    def state_dict(self) -> Dict[str, Any]:
        """All fields as plain python values."""
        return {"kind": self.kind, "value": self.value}

    def load_state_dict(self, d: Dict[str, Any]) -> None:
        """Restore from ``state_dict()``; ValueError if ``d`` is another controller's."""
        _check_kind(d, self.kind)
        self.value = float(d["value"])


class AdaptiveKLController:
    """Adaptive coefficient of Ziegler et al. 2019 ("Fine-Tuning LMs from Human Preferences", sec. 2.2).

    Formula: e = clip(KL / KL_target - 1, -0.2, 0.2); beta <- beta * (1 + e * n_steps / horizon).

    A proportional controller on log beta, as in the paper, verl and TRL.  ``n_steps`` is in the
    unit of ``horizon`` (verl passes samples per step with horizon 10000).  Keep n_steps / horizon
    below 5, or e = -0.2 makes the multiplier <= 0 (the reference formula does not guard this).
    """

    kind = "adaptive"

    def __init__(self, init_kl_coef: float, target_kl: float, horizon: float):
        self.value = _finite("init_kl_coef", init_kl_coef)
        self.target_kl = _finite("target_kl", target_kl)
        self.horizon = _finite("horizon", horizon)
        if not self.target_kl > 0:
            raise ValueError(f"target_kl must be > 0 (it divides the KL), got {target_kl}")
        if not self.horizon > 0:
            raise ValueError(f"horizon must be > 0, got {horizon}")

    def update(self, current_kl: float, n_steps: int = 1) -> None:
        """Scale ``value`` by 1 + clip(current_kl / target - 1, -0.2, 0.2) * n_steps / horizon."""
        current_kl = _finite("current_kl", current_kl)
        proportional_error = min(max(current_kl / self.target_kl - 1.0, -0.2), 0.2)
        self.value *= 1.0 + proportional_error * n_steps / self.horizon

    def state_dict(self) -> Dict[str, Any]:
        """All fields as plain python values."""
        return {"kind": self.kind, "value": self.value, "target_kl": self.target_kl, "horizon": self.horizon}

    def load_state_dict(self, d: Dict[str, Any]) -> None:
        """Restore from ``state_dict()``; ValueError if ``d`` is another controller's."""
        _check_kind(d, self.kind)
        self.value, self.target_kl, self.horizon = float(d["value"]), float(d["target_kl"]), float(d["horizon"])


class PIDKLController:
    """PID control of the coefficient on the KL error (our addition; not in verl).

    Formula: e = KL - KL_target; I += e dt; D = (e - e_prev) / dt; beta = clamp(beta_0 + kp e + ki I + kd D, min, max).

    dt = ``n_steps`` (use 1 per update for the textbook discrete PID).  D is 0 on the first update
    (no previous error, so no derivative kick).  Anti-windup by conditional integration: when the
    output is saturated and e pushes it further out, I is not accumulated, so the coefficient leaves
    a bound as soon as the error changes sign.  Gains must be >= 0 (KL above target raises beta).
    References: Ziegler et al. 2019 describe their adaptive beta as a log-space proportional (P)
    controller; Stooke, Achiam & Abbeel 2020 ("Responsive Safety in RL by PID Lagrangian Methods")
    drive a penalty coefficient (a Lagrange multiplier on a cost constraint) with PID.  We found no
    paper that applies full PID to the KL coefficient of LLM RL; this is the Stooke et al. scheme
    with the KL as the constrained quantity, additive around beta_0.
    """

    kind = "pid"

    def __init__(
        self,
        init_kl_coef: float,
        target_kl: float,
        kp: float,
        ki: float,
        kd: float,
        min_coef: float = 0.0,
        max_coef: Optional[float] = None,
    ):
        self.init_kl_coef = _finite("init_kl_coef", init_kl_coef)
        self.target_kl = _finite("target_kl", target_kl)
        self.kp, self.ki, self.kd = _finite("kp", kp), _finite("ki", ki), _finite("kd", kd)
        for name, g in (("kp", self.kp), ("ki", self.ki), ("kd", self.kd)):
            if g < 0:
                raise ValueError(f"{name} must be >= 0, got {g}")
        self.min_coef = _finite("min_coef", min_coef)
        self.max_coef = None if max_coef is None else _finite("max_coef", max_coef)
        if self.max_coef is not None and self.max_coef < self.min_coef:
            raise ValueError(f"max_coef ({max_coef}) must be >= min_coef ({min_coef})")
        self.integral = 0.0
        self.prev_error: Optional[float] = None
        self.value = self._clamp(self.init_kl_coef)

    def _clamp(self, x: float) -> float:
        x = max(x, self.min_coef)
        return x if self.max_coef is None else min(x, self.max_coef)

    def _raw(self, error: float, integral: float, derivative: float) -> float:
        return self.init_kl_coef + self.kp * error + self.ki * integral + self.kd * derivative

    def update(self, current_kl: float, n_steps: int = 1) -> None:
        """One PID step with dt = n_steps (> 0); sets ``value``."""
        current_kl = _finite("current_kl", current_kl)
        dt = _finite("n_steps", n_steps)
        if not dt > 0:
            raise ValueError(f"n_steps must be > 0 (it is the PID time step), got {n_steps}")
        error = current_kl - self.target_kl
        derivative = 0.0 if self.prev_error is None else (error - self.prev_error) / dt
        integral = self.integral + error * dt
        raw = self._raw(error, integral, derivative)
        above = self.max_coef is not None and raw > self.max_coef
        if (above and error > 0) or (raw < self.min_coef and error < 0):
            integral = self.integral  # anti-windup: do not integrate further into saturation
            raw = self._raw(error, integral, derivative)
        self.integral, self.prev_error = integral, error
        self.value = self._clamp(raw)

    def state_dict(self) -> Dict[str, Any]:
        """All fields (gains, bounds, integral, previous error) as plain python values."""
        return {
            "kind": self.kind, "value": self.value, "init_kl_coef": self.init_kl_coef, "target_kl": self.target_kl,
            "kp": self.kp, "ki": self.ki, "kd": self.kd, "min_coef": self.min_coef, "max_coef": self.max_coef,
            "integral": self.integral, "prev_error": self.prev_error,
        }

    def load_state_dict(self, d: Dict[str, Any]) -> None:
        """Restore from ``state_dict()``; ValueError if ``d`` is another controller's."""
        _check_kind(d, self.kind)
        for key in ("value", "init_kl_coef", "target_kl", "kp", "ki", "kd", "min_coef", "integral"):
            setattr(self, key, float(d[key]))
        self.max_coef = None if d["max_coef"] is None else float(d["max_coef"])
        self.prev_error = None if d["prev_error"] is None else float(d["prev_error"])


_CLASSES = {"fixed": FixedKLController, "adaptive": AdaptiveKLController, "pid": PIDKLController}


def make_kl_controller(kind: str, **kwargs):
    """Build a controller by name: "fixed" (kl_coef), "adaptive" (init_kl_coef, target_kl, horizon), "pid".

    Formula: _CLASSES[kind](**kwargs); an unknown kind raises ValueError listing the valid ones.
    """
    if kind not in _CLASSES:
        raise ValueError(f"unknown KL controller {kind!r}; valid: {', '.join(KL_CONTROLLERS)}")
    return _CLASSES[kind](**kwargs)
