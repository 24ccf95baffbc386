"""Plain PPO against PPO-Lagrangian (Safe-RLHF) on the conflicting demo task (task.py), one run each, then
both final policies measured the same way: 4 samples (T=1) for each of the 200 held-out prompts.

    python examples/safe_rlhf/compare.py [--out runs/safe_rlhf] [--field value ...]   # from the repository root

About 2.5 minutes on 2 CPU cores (141 s, Intel Xeon with AMX); prints the table and writes OUT/results.json
(runs in OUT/ppo, OUT/ppo_lagrangian). Other flags override VerlConfig fields of both runs.
"""

import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from task import answer_length, forbidden_digit  # noqa: E402

from verl_hf import Actor  # noqa: E402
from verl_hf.cli import parse_config  # noqa: E402
from verl_hf.data import prepare_prompts  # noqa: E402
from verl_hf.demo import WARM_START_DIR  # noqa: E402
from verl_hf.runner import load_splits, run_training  # noqa: E402


def measure(model_dir: str, script, config) -> dict:
    """Mean reward (answer length) and unsafe rate of the policy's samples on the held-out prompts."""
    actor = Actor.from_pretrained(model_dir)
    _, test = load_splits(script)
    test = prepare_prompts(test, actor.tokenizer, None, config.max_prompt_length, "test")
    batch = actor.generate_sequences(prompt_ids=test["prompt_ids"], max_new_tokens=config.max_response_length,
                                     num_return_sequences=4, do_sample=True, seed=0)
    args = dict(prompts=batch.prompts, completions=batch.completions, completion_ids=None)
    rewards, costs = answer_length(**args), forbidden_digit(**args)
    return {"reward": sum(rewards) / len(rewards), "unsafe_rate": sum(costs) / len(costs), "samples": len(costs)}


def main(argv: list[str]) -> dict:
    out, extra = Path("runs/safe_rlhf"), list(argv)
    if "--out" in extra:
        i = extra.index("--out")
        out, extra = Path(extra[i + 1]), extra[:i] + extra[i + 2 :]
    results = {}
    for name in ("ppo", "ppo_lagrangian"):
        script, config = parse_config(str(HERE / f"{name}.yaml"), [*extra, "--output_dir", str(out / name)])
        summary = run_training(script, config)
        results[name] = {**measure(config.output_dir, script, config), "steps": summary["steps"],
                         "seconds": summary["seconds"]}
        if name == "ppo":
            results["before"] = measure(str(WARM_START_DIR), script, config)
    limit = config.cost_limit
    print(f"\n| policy | reward (answer length) | unsafe rate (limit {limit}) |\n|---|---:|---:|")
    for name in ("before", "ppo", "ppo_lagrangian"):
        print(f"| {name} | {results[name]['reward']:.3f} | {results[name]['unsafe_rate']:.3f} |")
    results["cost_limit"] = limit
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(results, indent=2))
    return results


if __name__ == "__main__":
    main(sys.argv[1:])
