"""One GRPO step with TRL's GRPOTrainer on a tiny randomly initialised Llama and a tokenizer
trained here (nothing downloaded), scored by market.train.grpo.EnvReward on a recorded
transcript: proves the wiring (dataset columns reach the reward, rewards are real env returns,
the trainer steps and the weights move)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("trl")
pytest.importorskip("datasets")
torch = pytest.importorskip("torch")

from datasets import Dataset  # noqa: E402
from real_model_utils import tiny_llama  # noqa: E402
from test_training_data import record_hand  # noqa: E402
from tokenizers import Tokenizer, models, pre_tokenizers, trainers  # noqa: E402
from transformers import LlamaForCausalLM, PreTrainedTokenizerFast  # noqa: E402

from market.train.grpo import EnvReward  # noqa: E402
from market.train.training_data import grpo_records  # noqa: E402

# Two whole replies are single tokens, and the model is rigged to emit (almost) only them, so the
# two completions of a group can differ in reward: with equal rewards GRPO's advantage is 0 and
# nothing would be learnt. Hand values (hand scenario, docs/rewards.md): winning a block at the
# reserve 5 for a job of value 30 pays (30 - 5) / 100; abstaining pays 0.
GOOD, EMPTY = '{"action_type":"bid","bids":[20]}', '{"action_type":"bid","bids":[]}'
HAND_VALUE = {GOOD: 0.25, EMPTY: 0.0}
TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|> {{ m['content'] }} <eos> {% endfor %}"
    "{% if add_generation_prompt %}<|assistant|> {% endif %}"
)


def tiny_tokenizer(texts: list[str]) -> PreTrainedTokenizerFast:
    core = Tokenizer(models.WordLevel(unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Whitespace()
    specials = ["<unk>", "<pad>", "<eos>", "<|system|>", "<|user|>", "<|assistant|>"]
    core.train_from_iterator(texts, trainers.WordLevelTrainer(special_tokens=specials))
    tok = PreTrainedTokenizerFast(
        tokenizer_object=core, unk_token="<unk>", pad_token="<pad>", eos_token="<eos>"
    )
    tok.add_tokens([GOOD, EMPTY])
    tok.chat_template = TEMPLATE
    return tok


def tiny_model(tok: PreTrainedTokenizerFast) -> LlamaForCausalLM:
    model = tiny_llama(
        vocab_size=len(tok),
        hidden_size=32,
        intermediate_size=64,
        num_key_value_heads=4,
        max_position_embeddings=4096,
        pad_token_id=tok.pad_token_id,
        eos_token_id=tok.eos_token_id,
        bos_token_id=tok.eos_token_id,
        tie_word_embeddings=False,
    )
    good, empty = tok.convert_tokens_to_ids([GOOD, EMPTY])
    with torch.no_grad():
        # residual dimension 0 is a constant 1 (no layer writes to it), so after the final norm
        # it is large for every position; only the two reply tokens read it
        model.model.embed_tokens.weight[:, 0] = 1.0
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight[0, :] = 0.0
            layer.mlp.down_proj.weight[0, :] = 0.0
        model.lm_head.weight[:, 0] = 0.0
        model.lm_head.weight[[good, empty], 0] = 2.0
    return model


def test_one_grpo_step_with_the_env_reward(tmp_path: Path) -> None:
    from trl import GRPOConfig, GRPOTrainer

    path = record_hand(tmp_path / "hand.jsonl")
    rows = grpo_records([path])
    assert len(rows) == 1 and rows[0]["phase"] == "bidding"
    dataset = Dataset.from_list(rows)
    tok = tiny_tokenizer([m["content"] for r in rows for m in r["prompt"]])
    env_reward = EnvReward("round")
    calls: list[dict[str, Any]] = []

    def gpumarket_reward(prompts: list[Any], completions: list[Any], **kwargs: Any) -> list[float]:
        out = env_reward(prompts, completions, **kwargs)
        calls.append({"completions": completions, "kwargs": kwargs, "rewards": out})
        return out

    # Sampling decides whether the group's two replies differ (about even odds); with equal
    # rewards the advantage is 0 and no weight moves, so try a few seeds (each is deterministic).
    for seed in range(8):
        calls.clear()
        model = tiny_model(tok)
        before = {n: p.detach().clone() for n, p in model.named_parameters()}
        args = GRPOConfig(
            output_dir=str(tmp_path / "out"),
            per_device_train_batch_size=2,
            num_generations=2,
            max_completion_length=2,
            max_steps=1,
            learning_rate=1e-2,
            logging_steps=1,
            report_to="none",
            use_cpu=True,
            save_strategy="no",
            seed=seed,
            bf16=False,
            dataloader_num_workers=0,
            disable_dropout=True,
        )
        trainer = GRPOTrainer(
            model=model,
            reward_funcs=gpumarket_reward,
            args=args,
            train_dataset=dataset,
            processing_class=tok,
        )
        trainer.train()
        assert trainer.state.global_step == 1
        assert len(calls) == 1
        if len(set(calls[0]["rewards"])) == 2:
            break
    call = calls[0]
    kwargs = call["kwargs"]
    assert kwargs["transcript"] == [rows[0]["transcript"]] * 2
    assert kwargs["step"] == [rows[0]["step"]] * 2
    assert kwargs["transcript_sha256"] == [rows[0]["transcript_sha256"]] * 2
    assert all(math.isfinite(r) for r in call["rewards"])
    texts = [c[-1]["content"] if isinstance(c, list) else c for c in call["completions"]]
    # each reward is the hand value of the first reply token the model wrote
    firsts = [
        GOOD
        if t.find(GOOD) != -1 and (t.find(EMPTY) == -1 or t.find(GOOD) < t.find(EMPTY))
        else EMPTY
        for t in texts
    ]
    assert call["rewards"] == pytest.approx([HAND_VALUE[f] for f in firsts], abs=1e-12)
    assert len(set(call["rewards"])) == 2, f"8 seeds gave equal rewards in the group: {texts}"
    changed = [n for n, p in model.named_parameters() if not torch.equal(p.detach(), before[n])]
    assert changed, "no parameter changed after the GRPO step"
