"""grpokit sft's progress line shows its loss, and the last held-out loss once there is one (issue 52, item 6: it
showed only the time and eta); a GRPO line (with rewards) is unchanged."""

from __future__ import annotations

from grpokit.run.log import RunLogger


def test_a_run_without_rewards_shows_its_loss_and_the_held_out_loss(tmp_path, capsys):
    with RunLogger(tmp_path, total_steps=4, tensorboard=False) as log:
        log.log_step(1, {"loss": 2.345678, "time/step": 0.5, "tokens_per_s": 100.0})
        log.log_eval(1, {"loss": 2.5, "perplexity": 12.18})
        log.log_step(2, {"loss": 2.1, "time/step": 0.5})
        log.log_step(3, {"reward/total/mean": 0.5, "loss": 0.01})  # a GRPO step: no loss on its line
    lines = capsys.readouterr().err.splitlines()
    assert lines[0] == "step 1/4 | loss 2.3457 | 0.50 s/step | 100 tok/s | eta 0:02"  # 3 steps x 0.5 s
    assert lines[2].startswith("step 2/4 | loss 2.1000 | eval loss 2.5000 | 0.50 s/step | eta ")
    assert lines[3].startswith("step 3/4 | reward 0.500 | eta ")
