"""MT-GRPO's turn-level credit (verl_hf/algorithms/turn_credit.py) against hand-computed examples."""

import pytest
import torch

from verl_hf.algorithms import advantage_spec, grpo_advantages, mt_grpo_advantages, turn_index

# One prompt, three conversations (T = 6). Turns are runs of response tokens; 0s between runs are the tool's.
#   row 0: turn 0 at 0-1, tool at 2, turn 1 at 3;  turn rewards 1.0 (pos 1), 0.2 (pos 3); outcome 1 (pos 3)
#   row 1: turn 0 at 0-1, tool at 2, turn 1 at 3-4; turn rewards 0.0, 0.0;             outcome 0
#   row 2: one turn at 0-2;                          turn reward 0.5 (pos 2);           outcome 0
MASK = torch.tensor([[1, 1, 0, 1, 0, 0], [1, 1, 0, 1, 1, 0], [1, 1, 1, 0, 0, 0]], dtype=torch.float32)
TURNS = torch.tensor([[0, 1.0, 0, 0.2, 0, 0], [0, 0, 0, 0, 0, 0], [0, 0, 0.5, 0, 0, 0]])
OUTCOME = torch.tensor([[0, 0, 0, 1.0, 0, 0], [0, 0, 0, 0, 0, 0], [0, 0, 0, 0, 0, 0]])
GROUP = torch.tensor([7, 7, 7])


def test_turn_index_counts_runs_of_response_tokens():
    assert turn_index(MASK).tolist() == [[0, 0, 0, 1, 1, 1], [0, 0, 0, 1, 1, 1], [0, 0, 0, 0, 0, 0]]
    assert turn_index(torch.tensor([[0, 1, 1, 0, 1]])).tolist() == [[-1, 0, 0, 0, 1]]


def test_each_turn_gets_the_outcome_plus_its_own_and_the_later_turns_credit():
    """Without std (epsilon 0): A^O = s - mean = [2/3, -1/3, -1/3]; turn 0's rewards [1, 0, 0.5] give
    A^T_0 = [0.5, -0.5, 0]; turn 1's [0.2, 0] among rows 0 and 1 (row 2 has no turn 1) give [0.1, -0.1, 0].
    Row 0: turn 0 = 2/3 + 0.5 + 0.1, turn 1 = 2/3 + 0.1; row 1: -1/3 - 0.5 - 0.1, -1/3 - 0.1; row 2: -1/3 + 0."""
    adv, returns = mt_grpo_advantages(OUTCOME + TURNS, MASK, GROUP, TURNS, norm_by_std=False, epsilon=0.0)
    a, b, c = 2 / 3, -1 / 3, -1 / 3
    expected = torch.tensor([[a + 0.6, a + 0.6, 0, a + 0.1, 0, 0],
                             [b - 0.6, b - 0.6, 0, b - 0.1, b - 0.1, 0],
                             [c, c, c, 0, 0, 0]])
    torch.testing.assert_close(adv, expected)
    torch.testing.assert_close(returns, adv)
    half, _ = mt_grpo_advantages(OUTCOME + TURNS, MASK, GROUP, TURNS, turn_coef=0.5, norm_by_std=False, epsilon=0.0)
    assert half[0, 0].item() == pytest.approx(a + 0.3) and half[1, 4].item() == pytest.approx(b - 0.05)


def test_with_std_each_term_is_divided_by_its_own_groups_std():
    """Outcome [1, 0, 0]: std 0.57735, A^O = [1.1547, -0.57735, -0.57735]; turn 0 [1, 0, 0.5]: std 0.5,
    A^T_0 = [1, -1, 0]; turn 1 [0.2, 0]: std 0.141421, A^T_1 = [0.70711, -0.70711]."""
    adv, _ = mt_grpo_advantages(OUTCOME + TURNS, MASK, GROUP, TURNS, epsilon=0.0)
    assert adv[0, 0].item() == pytest.approx(1.1547005 + 1 + 0.7071068, rel=1e-5)
    assert adv[0, 3].item() == pytest.approx(1.1547005 + 0.7071068, rel=1e-5)
    assert adv[1, 4].item() == pytest.approx(-0.5773503 - 0.7071068, rel=1e-5)
    assert adv[2, 1].item() == pytest.approx(-0.5773503, rel=1e-5)


def test_without_turn_rewards_it_is_grpo_and_tool_tokens_get_nothing():
    rewards = OUTCOME + TURNS
    grpo, _ = grpo_advantages(rewards, MASK, GROUP)
    for turns in (None, torch.zeros_like(TURNS)):
        torch.testing.assert_close(mt_grpo_advantages(rewards, MASK, GROUP, turns)[0], grpo)
    adv, _ = mt_grpo_advantages(rewards, MASK, GROUP, TURNS)
    assert (adv[MASK == 0] == 0).all()
    # a second group is normalised on its own: the same rows under another id give the same advantages
    both, _ = mt_grpo_advantages(torch.cat([rewards, rewards]), torch.cat([MASK, MASK]), torch.tensor([1, 1, 1, 2, 2, 2]),
                                 torch.cat([TURNS, TURNS]))
    torch.testing.assert_close(both, torch.cat([adv, adv]))


def test_equal_turn_rewards_and_a_turn_only_one_sample_reached_carry_no_turn_signal():
    equal = torch.tensor([[0, 1.0, 0, 0, 0, 0], [0, 1.0, 0, 0, 0, 0], [0, 0, 1.0, 0, 0, 0]])
    adv, _ = mt_grpo_advantages(OUTCOME + equal, MASK, GROUP, equal, norm_by_std=False, epsilon=0.0)
    outcome, _ = grpo_advantages(OUTCOME, MASK, GROUP, norm_by_std=False, epsilon=0.0)
    torch.testing.assert_close(adv, outcome)
    # Only row 0 reaches turn 1 (rows 1 and 2 answer in one turn): its turn-1 reward 5 has no baseline, so it adds
    # nothing, whatever singleton_advantage says of whole groups of one.
    mask = torch.tensor([[1, 1, 0, 1], [1, 1, 1, 0], [1, 1, 0, 0]], dtype=torch.float32)
    turns = torch.tensor([[0, 0, 0, 5.0], [0, 0, 0, 0], [0, 0, 0, 0]])
    for rule in ("score", "zero"):
        adv, _ = mt_grpo_advantages(turns, mask, GROUP, turns, singleton_advantage=rule)
        assert (adv == 0).all(), (rule, adv)


def test_the_outcome_given_apart_is_exact_where_subtracting_rounds():
    """Both rows: one turn, outcome 0.1, turn reward 0.2, so no signal. In fp32, 0.1 + 0.2 on one token minus
    0.2 is not 0.1 again; the outcome passed apart (as the round passes it) keeps them equal."""
    mask = torch.ones(2, 4)
    outcome = torch.tensor([[0, 0, 0, 0.1], [0, 0, 0, 0.1]])
    turns = torch.tensor([[0, 0.2, 0, 0], [0, 0, 0, 0.2]])
    adv, _ = mt_grpo_advantages(outcome + turns, mask, torch.tensor([0, 0]), turns, outcome)
    assert (adv == 0).all()


def test_groups_whose_turns_differ_inform_even_when_their_totals_are_equal():
    """Rows 0 and 1 total 1 each, but turn 0 gives one 1 and the other 0: informative for MT-GRPO (dynamic
    sampling keeps it), while GRPO sees a flat group."""
    from verl_hf.algorithms import turn_rewards_differ

    mask = torch.tensor([[1, 0, 1], [1, 0, 1], [1, 0, 1], [1, 0, 1]], dtype=torch.float32)
    turns = torch.tensor([[1.0, 0, 0], [0, 0, 1.0], [1.0, 0, 0], [1.0, 0, 0]])
    groups = torch.tensor([0, 0, 1, 1])
    assert turn_rewards_differ(turns, mask, groups).tolist() == [True, True, False, False]
    assert turn_rewards_differ(turns, mask, groups, valid=torch.tensor([True, False, True, True])).tolist() == \
        [False, False, False, False]  # an unscored row leaves its group's comparison
    # Turn 0's rewards [1, 0] give +-0.5, turn 1's [0, 1] give -+0.5: row 0's first turn gets its own +0.5 and
    # its second turn's -0.5 (reward-to-go), its second turn -0.5; row 1 the opposite.
    adv, _ = mt_grpo_advantages(turns, mask, groups, turns, norm_by_std=False)
    assert adv[:2].tolist() == [[0.0, 0.0, -0.5], [0.0, 0.0, 0.5]] and (adv[2:] == 0).all()


def test_registered_as_needing_groups_and_turn_rewards():
    spec = advantage_spec("mt_grpo")
    assert spec.needs_groups and spec.needs_turn_rewards and spec.display_name == "MT-GRPO"
    assert not advantage_spec("grpo").needs_turn_rewards
