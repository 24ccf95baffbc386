"""The weight sync on real ZeRO-3 partitions, two processes under `accelerate launch` (DeepSpeed over gloo):
the chunked partition gather (to every rank, or to one owner rank only), a verified sync into inference
copies, a failed push on the owner rank (every rank raises, none hangs), and the error for an engine that
cannot receive weights. The full training runs are in
test_distributed.py."""

import textwrap

from conftest import run_two_processes

# Both scripts' start: the process group (gloo), then `CHECKPOINT` loaded whole (`full`, to compare with) and
# as ZeRO-3 partitions (`model`), with its tokenizer (`tok`).
PARTITIONED = textwrap.dedent('''
    import os
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    import deepspeed, torch
    import torch.distributed as dist
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.initialization import no_init_weights
    from verl_hf.demo import TOOLS_WARM_START_DIR, WARM_START_DIR

    deepspeed.init_distributed(dist_backend="gloo")
    rank = dist.get_rank()
    tok = AutoTokenizer.from_pretrained(str(CHECKPOINT))
    full = AutoModelForCausalLM.from_pretrained(str(CHECKPOINT))
    with no_init_weights(), deepspeed.zero.Init(config_dict_or_path={"train_micro_batch_size_per_gpu": 1,
                                                                      "zero_optimization": {"stage": 3}}):
        model = type(full)(full.config)
        model.tie_weights()
    with deepspeed.zero.GatheredParameters(list(model.parameters()), modifier_rank=0):
        model.load_state_dict(full.state_dict())
''')


# Two checks of a sharded `model` against its whole twin `full` (either sharding): a verified sync into an
# inference copy in several buckets, and a sync to one owner rank (rank 1 only sends its shards).
VERIFIED_SYNCS = '''
    # 2. a sync into inference copies, checked against the sharding's own gather (sync_verify)
    engine = HFCopyEngine.of(model, tok.pad_token_id, [tok.eos_token_id])
    metrics = WeightSync(bucket_mb=0.5, verify=True).sync(model, engine)
    assert metrics["sync/buckets"] > 1, metrics
    for name, p in full.named_parameters():
        assert torch.equal(engine.get_weights([name])[name], p), name

    # 3. one owner: only rank 0's engine receives weights; rank 1 only sends its shards
    engine = HFCopyEngine.of(model, tok.pad_token_id, [tok.eos_token_id])
    metrics = WeightSync(bucket_mb=0.5, verify=True, owner_rank=0).sync(model, engine)
    pushed = metrics["sync/gigabytes"]
    weights = dict(engine.model.named_parameters())
    if rank == 0:
        assert pushed > 0 and all(torch.equal(weights[n], p) for n, p in full.named_parameters())
    else:
        assert pushed == 0 and all(bool((w == 0).all()) for w in weights.values())
'''


def partitioned_script(checkpoint: str, body: str) -> str:
    """A two-process script: PARTITIONED on `checkpoint` (a name in verl_hf.demo), then `body` (in which a
    line `VERIFIED_SYNCS` stands for those checks)."""
    body = textwrap.dedent(body).replace("VERIFIED_SYNCS\n", textwrap.dedent(VERIFIED_SYNCS).lstrip("\n"))
    return PARTITIONED.replace("CHECKPOINT", checkpoint) + body


SCRIPT = partitioned_script("WARM_START_DIR", '''
    from verl_hf.roles import Actor
    from verl_hf.rollout import HFCopyEngine, RolloutEngine
    from verl_hf.sync import WeightSync
    from verl_hf.sync.gather import gather_partitioned

    embed = model.model.embed_tokens.weight
    assert embed.numel() == 0 and 0 < embed.ds_tensor.numel() < embed.ds_numel  # really sharded over 2 ranks

    # 1. the chunked partition gather equals the weights (pieces that split rows), on every rank or on rank 0
    for name, p in model.named_parameters():
        assert torch.equal(gather_partitioned(p, "cpu", chunk_bytes=1000), full.get_parameter(name)), name
        only_owner = gather_partitioned(p, "cpu", chunk_bytes=1000, dst=0)
        assert torch.equal(only_owner, full.get_parameter(name)) if rank == 0 else only_owner is None, name

    VERIFIED_SYNCS

    # 3b. the owner's engine fails in the middle: no process hangs in a gather, every process raises
    class Broken(type(engine)):
        calls = 0
        def load_weights(self, named_tensors):
            Broken.calls += 1
            if Broken.calls == 2:
                raise OSError("the rollout server went away")
            return super().load_weights(named_tensors)
    broken = HFCopyEngine.of(model, tok.pad_token_id, [tok.eos_token_id])
    broken.__class__ = Broken
    try:
        WeightSync(bucket_mb=0.5, owner_rank=0).sync(model, broken)
    except OSError as e:
        assert rank == 0 and "went away" in str(e), e
    except RuntimeError as e:
        assert rank == 1 and "process 0 failed to push the weights" in str(e), e
    else:
        raise AssertionError("a failed push raised nothing")

    # 4. an engine that cannot receive weights is refused for a ZeRO-3 policy
    class FixedWeights(RolloutEngine):
        def generate(self, prompt_ids, params): ...
    try:
        Actor(model, tok, engine=FixedWeights())
    except ValueError as e:
        assert "cannot receive weights" in str(e) and "ZeRO-3" in str(e), e
    else:
        raise AssertionError("no error for an engine without load_weights under ZeRO-3")
    # tear the gloo group down before exit: left to interpreter shutdown, a busy machine sometimes aborts
    # a process in its destructor ("terminate called without an active exception") after all checks passed
    dist.barrier()
    dist.destroy_process_group()
    print(f"rank {rank}: ALL OK")
''')


def test_sync_from_zero3_partitions_two_processes(tmp_path):
    script = tmp_path / "zero3_sync.py"
    script.write_text(SCRIPT)
    run_two_processes(script)


SHARED_MULTI_TURN = partitioned_script("TOOLS_WARM_START_DIR", '''
    from verl_hf.agent import MultiTurnRollout, Step
    from verl_hf.data import tokenize_prompt
    from verl_hf.demo.tools_task import tools_splits
    from verl_hf.roles import Actor

    assert model.model.embed_tokens.weight.numel() == 0  # really partitioned: generating gathers it

    class Replies:  # rank 0's conversations end after their first turn, rank 1's go on to the third
        def reset(self, row):
            return None
        def step(self, message):
            return Step([{"role": "user", "content": "again"}], done=rank == 0)

    actor = Actor(model, tok)  # the HF engine on the partitioned training weights themselves
    assert actor.engine.calls_are_collective
    calls = []
    generate = actor.engine.generate
    actor.engine.generate = lambda ids, params: calls.append(len(ids)) or generate(ids, params)
    _, _, test = tools_splits()
    rows = [{"prompt": p, "prompt_ids": tokenize_prompt(tok, p), "answer": a}
            for p, a in zip(test["prompt"][:2], test["answer"][:2])]
    rollout = MultiTurnRollout(Replies, tok, None, max_turns=3, max_tokens=200, env_timeout_s=60)
    batch, metrics = actor.generate_conversations(rollout, rows, max_new_tokens=8, do_sample=False)
    assert len(calls) == 3, calls  # every turn, on both ranks
    if rank == 0:
        assert calls[1:] == [0, 0] and metrics["turns/mean"] == 1.0, (calls, metrics)
    else:
        assert min(calls) > 0 and metrics["turns/mean"] > 1.0, (calls, metrics)
    dist.barrier()
    dist.destroy_process_group()
    print(f"rank {rank}: ALL OK")
''')


def test_multi_turn_on_the_partitioned_training_weights_two_processes(tmp_path):
    """Multi-turn with the HF engine sampling from ZeRO-3 partitions (rollout_hf_weights='shared'): every
    generate call gathers the weights with the other process, so a rank whose conversations have all ended
    still joins each turn with nothing to sample, while the other rank's go on (before, it waited for ever)."""
    script = tmp_path / "zero3_multi_turn.py"
    script.write_text(SHARED_MULTI_TURN)
    run_two_processes(script, timeout=180)
