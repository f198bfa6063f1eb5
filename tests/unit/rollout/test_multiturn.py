"""Multi-turn rollouts (grpokit.rollout.multiturn) on a tiny real Qwen2: the model's ids kept as generated, the
environment's appended as ids, exactly the model's tokens in completion_mask, truncation, both generators."""

import pytest
import torch
from episode_parts import digit_parser, segments
from tool_model import TOOLS_TEMPLATE, tool_model

from grpokit.algos.process import process_group_advantages
from grpokit.core.errors import ConfigError
from grpokit.model.logprobs import completion_logprobs
from grpokit.rollout.envs import EnvStep, ToolEnvironment
from grpokit.rollout.generation import FastGenerator, HFGenerator
from grpokit.rollout.multiturn import ChatDelta, episode_step_rewards, run_episodes
from grpokit.rollout.tools import ToolRunner, load_tools

ROWS = [{"prompt": "what is 1+2"}, {"prompt": "hi"}]


class Echo:
    """A game: says which turn it was and how long the model's text was; rewards len % 3; never done."""

    def __init__(self, done_after: int = 99):
        self.turn, self.done_after = 0, done_after

    def reset(self, row):
        return [{"role": "user", "content": row["prompt"]}]

    def step(self, text):
        self.turn += 1
        return EnvStep(
            [{"role": "user", "content": f"turn {self.turn} len {len(text)}"}],
            float(len(text) % 3),
            self.turn >= self.done_after,
        )


def episodes(model, tok, envs, generator=None, rows=ROWS, group_size=2, **kw):
    settings = dict(max_turns=3, max_new_tokens=16, max_episode_tokens=120, temperature=1.0, seed=5)
    settings.update(kw)
    return run_episodes(
        generator or FastGenerator(),
        model,
        tok,
        ChatDelta(tok),
        envs,
        rows,
        group_size=group_size,
        eos_token_ids=[tok.eos_token_id],
        pad_token_id=tok.pad_token_id,
        **settings,
    )


def test_observation_ids_are_the_template_delta():
    _, tok = tool_model()
    delta = ChatDelta(tok)
    ids = delta.observation_ids([{"role": "tool", "content": "42"}], "<eos>")
    # after "<eos>" (the model's own last token) comes only the tool message and the next turn's opening
    assert tok.convert_ids_to_tokens(ids) == [
        "<|user|>",
        "r",
        "e",
        "s",
        "u",
        "l",
        "t",
        ":",
        "Ġ",
        "4",
        "2",
        "<|assistant|>",
    ]
    tok.chat_template = TOOLS_TEMPLATE.replace(
        "{{ eos_token }}", "{{ eos_token }}\n"
    )  # Qwen's "<|im_end|>\n"
    ids = ChatDelta(tok).observation_ids([{"role": "tool", "content": "7"}], "<eos>")
    assert tok.convert_ids_to_tokens(ids)[:2] == ["Ċ", "<|user|>"]  # the closing's rest comes first


def test_chat_template_problems_are_named():
    _, tok = tool_model()
    tok.chat_template = TOOLS_TEMPLATE.replace("{% if tools %}", "{% if false %}")
    with pytest.raises(ConfigError, match="ignores tools"):
        ChatDelta(tok, tools=[t.schema for t in load_tools([count_digits])])
    tok.chat_template = None
    with pytest.raises(ConfigError, match="has none"):
        ChatDelta(tok)


def test_model_tokens_alone_carry_the_mask_and_their_logprobs_are_the_sampled_ones():
    model, tok = tool_model()
    batch = episodes(model, tok, [Echo() for _ in range(4)])
    r = batch.rollout
    assert batch.metrics["episode/turns_mean"] > 1.5  # the test must see several turns
    delta = ChatDelta(tok)
    for i, ep in enumerate(batch.episodes):
        n = int(r.context_mask[i].sum())
        assert r.context_mask[i, :n].all() and not r.context_mask[i, n:].any()
        mask = r.completion_mask[i, :n].tolist()
        ids = r.completion_ids[i, :n].tolist()
        runs = segments(mask)
        model_runs = [(s, e) for v, s, e in runs if v == 1]
        tool_runs = [(s, e) for v, s, e in runs if v == 0]
        assert [e - 1 for _, e in model_runs] == ep.turn_ends  # one run of model tokens per turn
        turns = [m for m in ep.completion if m["role"] == "assistant"]
        observations = [m for m in ep.completion if m["role"] == "user"]
        for (s, e), message in zip(model_runs, turns):  # each turn's ids are what the model generated
            assert tok.decode(ids[s:e], skip_special_tokens=True) == message["content"]
        for k, (s, e) in enumerate(tool_runs):  # each gap is exactly the rendered answer, nothing more
            assert ids[s:e] == delta.observation_ids([observations[k]], "<eos>")
        assert (r.logprobs[i, :n][r.completion_mask[i, :n] == 0] == 0).all()
    # the trainer's log-probs of the same ids in the same context equal the sampler's
    with torch.no_grad():
        trained, _ = completion_logprobs(
            model,
            r.prompt_ids,
            r.prompt_mask,
            r.completion_ids,
            r.completion_mask,
            temperature=1.0,
            context_mask=r.context_mask,
        )
    gen = r.completion_mask.bool()
    torch.testing.assert_close(trained[gen], r.logprobs[gen], atol=2e-5, rtol=0)
    assert (trained[~gen] == 0).all()
    # and a naive oracle: one forward over each unpadded row, log-softmax at every model token
    for i in range(r.prompt_ids.shape[0]):
        p = r.prompt_ids[i][r.prompt_mask[i].bool()]
        c = r.completion_ids[i][r.context_mask[i].bool()]
        with torch.no_grad():
            logits = model(torch.cat([p, c])[None]).logits[0, len(p) - 1 : -1].float()  # (Lc, V)
        naive = logits.log_softmax(-1).gather(-1, c[:, None])[:, 0]
        m = r.completion_mask[i][: len(c)].bool()
        torch.testing.assert_close(naive[m], trained[i, : len(c)][m], atol=2e-5, rtol=0)


def test_episodes_end_on_done_max_turns_and_budget_with_the_flag():
    model, tok = tool_model()
    done = episodes(model, tok, [Echo(done_after=1) for _ in range(4)], max_turns=5)
    for ep in done.episodes:  # done after one answered turn: not truncated (unless the turn had no EOS)
        assert len(ep.turn_ends) == 1
        assert ep.truncated == (ep.turn_ends[0] == 15)
    capped = episodes(model, tok, [Echo() for _ in range(4)], max_turns=2)
    for ep in capped.episodes:  # Echo never says done: every episode is cut, after at most 2 turns
        assert ep.truncated and len(ep.turn_ends) <= 2
    budget = episodes(model, tok, [Echo() for _ in range(4)], max_turns=10, max_episode_tokens=30)
    assert budget.rollout.context_mask.sum(-1).max() <= 30
    assert all(ep.truncated for ep in budget.episodes)
    assert budget.rollout.truncated.tolist() == [True] * 4


class Scored(Echo):
    """Echo that scores its episode once it is over (envs: finish): the turns it was stepped on, and the
    length of a last turn it was not stepped on (cut); finish raises on request; a step raises on request."""

    finished: list = []

    def __init__(self, fail: str = ""):
        super().__init__()
        self.fail = fail

    def step(self, text):
        if self.fail == "step":
            raise RuntimeError("the game broke")
        return super().step(text)

    def finish(self, last_text):
        Scored.finished.append(self)
        if self.fail == "finish":
            raise ValueError("no score")
        return {"stepped": self.turn, "cut": None if last_text is None else len(last_text)}


def test_an_environments_finish_scores_each_episode_once_it_is_over_a_cut_last_turn_included():
    model, tok = tool_model()
    batch = episodes(model, tok, [Scored() for _ in range(4)], max_turns=3, max_new_tokens=12)
    for k, ep in enumerate(batch.episodes):
        turns = [m["content"] for m in ep.completion if m["role"] == "assistant"]
        cut = int(batch.rollout.completion_ids[k, ep.turn_ends[-1]]) != tok.eos_token_id  # ended without its EOS
        assert ep.env_scores == {"stepped": len(turns) - cut, "cut": len(turns[-1]) if cut else None}
    assert {ep.env_scores["cut"] is None for ep in batch.episodes} == {True, False}  # both cases seen
    Scored.finished = []
    envs = [Scored(), Scored("finish"), Scored("step"), Scored()]
    batch = episodes(model, tok, envs, max_turns=2, max_new_tokens=40)  # (turns end with their EOS: stepped)
    assert "finish raised ValueError: no score" in batch.episodes[1].failed  # its episode fails, named
    assert batch.episodes[1].env_scores is None and batch.episodes[3].env_scores is not None
    assert "step raised RuntimeError: the game broke" in batch.episodes[2].failed
    assert envs[2] not in Scored.finished  # a failed environment is not asked to score


@pytest.mark.slow
def test_both_generators_and_one_episode_at_a_time_give_the_same_greedy_episodes():
    model, tok = tool_model()
    fast = episodes(model, tok, [Echo() for _ in range(4)], temperature=0.0)
    hf = episodes(model, tok, [Echo() for _ in range(4)], generator=HFGenerator(), temperature=0.0)
    alone = [episodes(model, tok, [Echo()], rows=[row], group_size=1, temperature=0.0) for row in ROWS]
    assert fast.metrics["episode/turns_mean"] > 1
    for k, other in enumerate([hf.rollout, alone[0].rollout, alone[1].rollout]):
        rows = range(4) if k == 0 else ([0, 1] if k == 1 else [2, 3])
        for j, i in enumerate(rows):
            a = fast.rollout.completion_ids[i][fast.rollout.context_mask[i].bool()]
            b = (
                other.completion_ids[0 if k else j][other.context_mask[0 if k else j].bool()]
                if k
                else other.completion_ids[i][other.context_mask[i].bool()]
            )
            assert a.tolist() == b.tolist()


def count_digits(text: str) -> int:
    """How many digits the text has; raises on text with a 7.

    Args:
        text: any text
    """
    if "7" in text:
        raise ValueError("seven")
    return sum(ch.isdigit() for ch in text)


def test_tool_environment_turns_runs_and_errors():
    model, tok = tool_model()
    runner = ToolRunner(load_tools([count_digits]), timeout_s=5.0, workers=2)
    parser = digit_parser
    try:
        batch = episodes(
            model, tok, [ToolEnvironment(runner, parser) for _ in range(8)], group_size=4, max_turns=4
        )
    finally:
        runner.close()
    calls = sum(ep.tool_calls for ep in batch.episodes)
    assert batch.metrics["tools/calls"] == calls == runner.counts["calls"] > 0
    assert batch.metrics["tools/errors"] == runner.counts["errors"]
    for ep in batch.episodes:
        for m in ep.completion:
            if m["role"] == "tool":
                assert m["content"].isdigit() or m["content"] == "Error: ValueError: seven"
        if not ep.truncated:  # the last turn had no digit, so no call: the answer
            assert not any(c.isdigit() for c in ep.completion[-1]["content"])
    assert 0 < batch.metrics["masked_token_frac"] < 1


def test_turn_rewards_become_process_steps_at_each_turns_last_token():
    model, tok = tool_model()
    batch = episodes(model, tok, [Echo() for _ in range(4)])
    steps = episode_step_rewards(batch.episodes, outcome=[1.0, 0.0, 1.0, 0.0])
    for ep, s in zip(batch.episodes, steps):
        rewarded = [(t, r) for t, r in zip(ep.turn_ends, ep.turn_rewards) if r is not None]
        assert s == rewarded + [(ep.turn_ends[-1], [1.0, 0.0, 1.0, 0.0][batch.episodes.index(ep)])]
    adv = process_group_advantages(steps, 2, batch.rollout.completion_mask)
    assert (adv[batch.rollout.completion_mask == 0] == 0).all()


def test_process_advantages_on_a_hand_made_multi_turn_mask():
    # two episodes of one group; tool tokens (0) between the turns. Steps at the turns' last tokens:
    # ep 0: turn ends 1 (score 1) and 4 (score 0); ep 1: turn end 2 (score 1). R = [1, 0, 1]: mean 2/3,
    # std 0.5774, normalised [0.5774, -1.1547], [0.5774]. A_{i,t} = sum of normalised scores ending >= t.
    mask = torch.tensor([[1, 1, 0, 0, 1, 0], [1, 1, 1, 0, 0, 0]])
    adv = process_group_advantages([[(1, 1.0), (4, 0.0)], [(2, 1.0)]], 2, mask)
    a, b = 0.57735, -1.15470
    expected = torch.tensor([[a + b, a + b, 0, 0, b, 0], [a, a, a, 0, 0, 0]])
    torch.testing.assert_close(adv, expected, atol=1e-4, rtol=0)


def test_select_and_concat_keep_the_context_mask():
    from grpokit.rollout.batch import ScoredBatch, concat_batches
    from grpokit.rollout.generation import Rollout

    def batch(width, ctx_rows):
        n = len(ctx_rows)
        ctx = torch.tensor([[1] * k + [0] * (width - k) for k in ctx_rows])
        model = ctx.clone()
        model[:, 1] = 0  # a tool token at column 1
        r = Rollout(
            prompt_ids=torch.ones(n, 2, dtype=torch.long), prompt_mask=torch.ones(n, 2, dtype=torch.long),
            completion_ids=torch.full((n, width), 5), completion_mask=model, logprobs=torch.zeros(n, width),
            truncated=torch.zeros(n, dtype=torch.bool), context_mask=ctx,
        )  # fmt: skip
        return ScoredBatch(r, [{}] * n, [""] * n, torch.zeros(n), {"f": [0.0] * n}, {})

    joined = concat_batches([batch(3, [3, 2]), batch(5, [5, 4])], pad_token_id=0)
    assert joined.rollout.context_mask.tolist() == [
        [1, 1, 1, 0, 0],
        [1, 1, 0, 0, 0],
        [1, 1, 1, 1, 1],
        [1, 1, 1, 1, 0],
    ]
    assert joined.rollout.row_lengths.tolist() == [2 + 3, 2 + 2, 2 + 5, 2 + 4]  # tool tokens count
    assert joined.rollout.completion_lengths.tolist() == [2, 1, 4, 3]  # only the model's
    picked = joined.select_groups([1], 2).rollout
    assert picked.context_mask.tolist() == [[1, 1, 1, 1, 1], [1, 1, 1, 1, 0]]
