"""The weight sync on a real ZeRO-3-partitioned model in one process (DeepSpeed over gloo, world size 1), run
in a subprocess so that its process group stays out of the test session. Two-process runs: test_distributed.py."""

import os
import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent('''
    import os, socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK="0", LOCAL_RANK="0", WORLD_SIZE="1",
                      DS_ACCELERATOR="cpu")
    import deepspeed, torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.initialization import no_init_weights
    from verl_hf.demo import WARM_START_DIR
    from verl_hf.roles import Actor
    from verl_hf.rollout import HFGenerateEngine
    from verl_hf.sync import WeightSync
    from verl_hf.sync.gather import gather_partitioned

    deepspeed.init_distributed(dist_backend="gloo")
    tok = AutoTokenizer.from_pretrained(str(WARM_START_DIR))
    full = AutoModelForCausalLM.from_pretrained(str(WARM_START_DIR))
    with no_init_weights(), deepspeed.zero.Init(config_dict_or_path={"train_micro_batch_size_per_gpu": 1,
                                                                      "zero_optimization": {"stage": 3}}):
        model = type(full)(full.config)
        model.tie_weights()
    with deepspeed.zero.GatheredParameters(list(model.parameters()), modifier_rank=0):
        model.load_state_dict(full.state_dict())
    embed = model.model.embed_tokens.weight
    assert embed.numel() == 0 and embed.ds_numel > 0  # really partitioned

    # 1. the chunked partition gather equals the weights, also with chunks that split rows
    for name, p in model.named_parameters():
        got = gather_partitioned(p, "cpu", chunk_bytes=1000)
        assert torch.equal(got, full.get_parameter(name)), name

    # 2. a sync into an inference copy, checked by DeepSpeed's own GatheredParameters
    engine = HFGenerateEngine.inference_copy(model, tok.pad_token_id, [tok.eos_token_id])
    metrics = WeightSync(bucket_mb=0.5, verify=True).sync(model, engine)
    assert metrics["sync/buckets"] > 1, metrics
    for name, p in full.named_parameters():
        assert torch.equal(engine.get_weights([name])[name], p), name

    # 3. an engine that cannot receive weights is refused for a ZeRO-3 policy
    class FixedWeights:
        def generate(self, prompt_ids, params): ...
    try:
        Actor(model, tok, engine=FixedWeights())
    except ValueError as e:
        assert "cannot receive weights" in str(e) and "ZeRO-3" in str(e), e
    else:
        raise AssertionError("no error for an engine without load_weights under ZeRO-3")
    print("ALL OK")
''')


def test_sync_from_zero3_partitions_in_one_process(tmp_path):
    script = tmp_path / "zero3_sync.py"
    script.write_text(SCRIPT)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    result = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300, env=env)
    assert result.returncode == 0 and "ALL OK" in result.stdout, result.stderr[-3000:]
