"""Hand-computed checks for verl_hf.algorithms.kl_control (fixed, adaptive, PID controllers)."""

import json

import pytest

from verl_hf.algorithms.kl_control import (
    KL_CONTROLLERS,
    AdaptiveKLController,
    FixedKLController,
    PIDKLController,
    make_kl_controller,
)

approx = pytest.approx


def test_fixed_never_moves():
    c = make_kl_controller("fixed", kl_coef=0.05)
    assert isinstance(c, FixedKLController)
    c.update(current_kl=10.0, n_steps=100)
    c.update(0.0, 1)
    assert c.value == 0.05


def test_adaptive_hand():
    c = make_kl_controller("adaptive", init_kl_coef=0.1, target_kl=0.1, horizon=10)
    assert isinstance(c, AdaptiveKLController)
    # kl 0.3: 0.3 / 0.1 - 1 = 2 -> clipped to 0.2 ; mult = 1 + 0.2 * 5 / 10 = 1.1 -> 0.11
    c.update(current_kl=0.3, n_steps=5)
    assert c.value == approx(0.11)
    # kl 0.05: 0.5 - 1 = -0.5 -> clipped to -0.2 ; mult = 1 - 0.2 * 5 / 10 = 0.9 -> 0.099
    c.update(0.05, 5)
    assert c.value == approx(0.099)
    # kl 0.11: 1.1 - 1 = 0.1 (inside the clip) ; mult = 1 + 0.1 * 10 / 10 = 1.1 -> 0.1089
    c.update(0.11, 10)
    assert c.value == approx(0.1089)
    # on target: error 0 -> unchanged
    c.update(0.1, 7)
    assert c.value == approx(0.1089)


def test_pid_hand_with_anti_windup():
    c = make_kl_controller("pid", init_kl_coef=0.1, target_kl=0.1, kp=1.0, ki=0.5, kd=2.0, min_coef=0.0, max_coef=0.5)
    assert isinstance(c, PIDKLController) and c.value == 0.1
    # 1) kl 0.3, dt 1: e = 0.2, I = 0.2, D = 0 (first step) -> 0.1 + 0.2 + 0.5*0.2 + 0 = 0.4
    c.update(0.3, 1)
    assert c.value == approx(0.4) and c.integral == approx(0.2)
    # 2) kl 0.2, dt 1: e = 0.1, I = 0.3, D = (0.1 - 0.2)/1 = -0.1 -> 0.1 + 0.1 + 0.15 - 0.2 = 0.15
    c.update(0.2, 1)
    assert c.value == approx(0.15) and c.integral == approx(0.3)
    # 3) kl 0.0, dt 2: e = -0.1, D = (-0.1 - 0.1)/2 = -0.1, I would be 0.3 - 0.2 = 0.1 ->
    #    0.1 - 0.1 + 0.05 - 0.2 = -0.15 < min with e < 0 -> anti-windup keeps I = 0.3 ->
    #    0.1 - 0.1 + 0.15 - 0.2 = -0.05 -> clamped to 0.0
    c.update(0.0, 2)
    assert c.value == 0.0 and c.integral == approx(0.3)
    # 4) kl 0.1, dt 1: e = 0, D = (0 + 0.1)/1 = 0.1, I = 0.3 -> 0.1 + 0 + 0.15 + 0.2 = 0.45
    c.update(0.1, 1)
    assert c.value == approx(0.45)
    # 5) kl 1.1: e = 1, D = 1, I would be 1.3 -> 3.75 > max with e > 0 -> I stays 0.3 -> 3.25 -> clamped 0.5
    c.update(1.1, 1)
    assert c.value == 0.5 and c.integral == approx(0.3)


def test_pid_proportional_only_and_unbounded_max():
    c = PIDKLController(init_kl_coef=0.2, target_kl=1.0, kp=0.1, ki=0.0, kd=0.0)
    c.update(31.0)  # e = 30 -> 0.2 + 3 = 3.2 (max_coef None: no upper bound)
    assert c.value == approx(3.2)
    c.update(-9.0)  # e = -10 -> 0.2 - 1 = -0.8 -> min_coef 0
    assert c.value == 0.0


@pytest.mark.parametrize(
    "kind, kwargs",
    [
        ("fixed", dict(kl_coef=0.05)),
        ("adaptive", dict(init_kl_coef=0.1, target_kl=0.1, horizon=10)),
        ("pid", dict(init_kl_coef=0.1, target_kl=0.1, kp=1.0, ki=0.5, kd=2.0, max_coef=0.5)),
    ],
)
def test_state_round_trip_resumes_exactly(kind, kwargs):
    kls = [0.3, 0.2, 0.0, 0.1, 1.1, 0.05, 0.12]
    a = make_kl_controller(kind, **kwargs)
    for kl in kls[:3]:
        a.update(kl, 2)
    state = json.loads(json.dumps(a.state_dict()))  # checkpoint-safe: plain JSON values
    assert state["kind"] == kind
    # a fresh controller built with other settings takes everything from the state
    b = make_kl_controller(kind, **{k: (v * 3 if isinstance(v, float) else v) for k, v in kwargs.items()})
    b.load_state_dict(state)
    assert b.state_dict() == a.state_dict()
    for kl in kls[3:]:
        a.update(kl, 1)
        b.update(kl, 1)
        assert b.value == a.value
    assert b.state_dict() == a.state_dict()
    wrong = {**state, "kind": "fixed" if kind != "fixed" else "adaptive"}
    with pytest.raises(ValueError, match=f"state_dict is for a '{wrong['kind']}' KL controller, not '{kind}'"):
        b.load_state_dict(wrong)


def test_pid_state_keeps_first_step_semantics():
    # a controller that never updated restores prev_error = None -> no derivative kick after resume
    a = PIDKLController(0.1, 0.1, kp=0.0, ki=0.0, kd=5.0)
    b = PIDKLController(0.1, 0.1, kp=0.0, ki=0.0, kd=5.0)
    b.update(0.9)
    b.load_state_dict(a.state_dict())
    b.update(0.5)
    assert b.value == approx(0.1)  # D = 0 on the first step


def test_unknown_kind_lists_valid():
    assert KL_CONTROLLERS == ("adaptive", "fixed", "pid")
    with pytest.raises(ValueError, match=r"unknown KL controller 'linear'; valid: adaptive, fixed, pid"):
        make_kl_controller("linear", kl_coef=0.1)


def test_invalid_settings_and_readings():
    with pytest.raises(ValueError, match="target_kl must be > 0"):
        AdaptiveKLController(0.1, 0.0, 10)
    with pytest.raises(ValueError, match="horizon must be > 0"):
        AdaptiveKLController(0.1, 0.1, 0)
    with pytest.raises(ValueError, match="ki must be >= 0"):
        PIDKLController(0.1, 0.1, kp=1.0, ki=-1.0, kd=0.0)
    with pytest.raises(ValueError, match="max_coef"):
        PIDKLController(0.1, 0.1, 1.0, 0.0, 0.0, min_coef=0.5, max_coef=0.2)
    c = PIDKLController(0.1, 0.1, 1.0, 0.0, 0.0)
    with pytest.raises(ValueError, match="n_steps must be > 0"):
        c.update(0.2, 0)
    for ctrl in (c, AdaptiveKLController(0.1, 0.1, 10)):
        with pytest.raises(ValueError, match="current_kl must be finite"):
            ctrl.update(float("nan"), 1)
        assert ctrl.value == 0.1  # a bad reading leaves the coefficient untouched
