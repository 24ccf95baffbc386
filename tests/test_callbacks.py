"""verl_hf.callbacks: the progress table shows the RL metrics."""

from conftest import small_config
from verl_hf import VerlTrainer
from verl_hf.callbacks import RLProgressCallback


def test_progress_table_prints_rows(tmp_path, warm_start_dir, addition, capsys):
    args = small_config(tmp_path, max_steps=4, logging_steps=2, eval_strategy="steps", eval_steps=4)
    trainer = VerlTrainer(model=warm_start_dir, args=args, train_dataset=addition[0],
                          eval_dataset=addition[1].select(range(10)), callbacks=[RLProgressCallback()])
    trainer.train()
    out = capsys.readouterr()
    lines = [line for line in (out.out + out.err).splitlines() if line.strip().split(" ")[0].isdigit()
             or "reward" in line]
    header = next(line for line in lines if "reward" in line and "eval_acc" in line)
    rows = [line.split() for line in lines if line.split()[0] in ("2", "4")]
    assert header.split()[:3] == ["step", "reward", "eval_acc"]
    assert len(rows) >= 2 and all(len(r) == len(header.split()) for r in rows)
    assert float(rows[0][1]) > 0  # a mean reward, not a dash
