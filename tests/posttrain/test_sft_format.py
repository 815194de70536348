"""The chat format and packing of SFT: role tokens appended to a real BPE tokenizer (recorded in lineage
with the base as parent), the encoder's ids equal to what transformers renders from the export's chat
template, a loss mask over exactly the answers, packed rows whose examples cannot see each other (a
packed example's logits equal its logits alone), the masked loss independent of the micro-batching,
start weights that keep every old row, and a loader that resumes where it stopped. Small real parts:
a tokenizer trained here, a sqlite lake, porting rows from the real generator."""

import datetime as dt
import json

import numpy as np
import pyarrow as pa
import pytest
import torch
from tokenizers import trainers

from factory.lake.commit import CommitStamp
from factory.lake.schemas import SYNTHETIC_DOCUMENTS
from factory.posttrain.sft import SFTConfig, build_examples
from factory.posttrain.sft.data import SFTLoader, encode_examples, pack, read_examples
from factory.synth.porting import port_to_python, word_problems
from factory.tokenize.bpe import SPECIAL_TOKENS, TokenizerArtifact, _new_tokenizer, load_tokenizer
from factory.tokenize.chat import CHAT_TEMPLATE, ROLES, ChatError, chat_tokenizer, encode_chat
from factory.train.config import ModelConfig
from factory.train.model import Transformer
from factory.train.trainer import _forward_backward

TEXTS = [port_to_python(p) + "\n" + p["question"] for p in word_problems(200)]


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> TokenizerArtifact:
    directory = tmp_path_factory.mktemp("tok") / "base"
    directory.mkdir()
    tokenizer = _new_tokenizer()
    tokenizer.train_from_iterator(TEXTS, trainer=trainers.BpeTrainer(vocab_size=600, show_progress=False,
                                                                    special_tokens=list(SPECIAL_TOKENS.values())))
    tokenizer.save(str(directory / "tokenizer.json"))
    return TokenizerArtifact(name="t", version_id="tokenizer/t@0123456789ab", path=str(directory), content_hash="x",
                             vocab_size=tokenizer.get_vocab_size(), special_ids={}, sampled={}, sample_docs={},
                             sample_bytes={}, bytes_per_token={})


@pytest.fixture
def chat(lake, base):
    return chat_tokenizer(lake, base)


def test_role_tokens_are_appended_and_recorded_once(lake, base, chat):
    tokenizer = load_tokenizer(chat.path)
    assert [tokenizer.token_to_id(t) for t in ROLES.values()] == [base.vocab_size, base.vocab_size + 1,
                                                                  base.vocab_size + 2]
    assert tokenizer.encode("x = 1", add_special_tokens=False).ids == \
        load_tokenizer(base.path).encode("x = 1", add_special_tokens=False).ids  # old ids unchanged
    [record] = lake.lineage.records(version_id=chat.version_id)
    assert record.kind == "tokenizer" and record.upstream == [base.version_id]
    assert chat_tokenizer(lake, base) == chat and len(lake.lineage.records(version_id=chat.version_id)) == 1
    assert chat_tokenizer(lake, chat) == chat  # already a chat tokenizer


def test_encoded_ids_are_what_transformers_renders_and_the_mask_covers_the_answers(chat):
    from transformers import PreTrainedTokenizerFast

    tokenizer = load_tokenizer(chat.path)
    hf = PreTrainedTokenizerFast(tokenizer_file=f"{chat.path}/tokenizer.json", bos_token="<|bos|>",
                                 eos_token="<|eos|>", pad_token="<|pad|>")
    hf.chat_template = CHAT_TEMPLATE
    messages = [{"role": "system", "content": "Answer in Python."}, {"role": "user", "content": TEXTS[0][-80:]},
                {"role": "assistant", "content": TEXTS[1][:120]}, {"role": "user", "content": "And  again?\n"},
                {"role": "assistant", "content": "\n    return total\n"}]
    for history, prompt in ((messages, False), (messages[:2], True)):
        rendered = hf.apply_chat_template(history, add_generation_prompt=prompt, tokenize=False)
        assert hf(rendered, add_special_tokens=False)["input_ids"] == \
            encode_chat(tokenizer, history, add_generation_prompt=prompt).ids

    encoded = encode_chat(tokenizer, messages)
    ids = {t: tokenizer.token_to_id(t) for t in ("<|bos|>", "<|eos|>", *ROLES.values())}
    learned = [i for i, m in zip(encoded.ids, encoded.mask) if m]
    answers = [tokenizer.encode(m["content"], add_special_tokens=False).ids + [ids["<|eos|>"]]
               for m in messages if m["role"] == "assistant"]
    assert learned == answers[0] + answers[1]
    assert not any(m for i, m in zip(encoded.ids, encoded.mask) if i in (ids["<|bos|>"], *map(ids.get, ROLES.values())))
    with pytest.raises(ChatError, match=r"message 1: unknown role 'tool'"):
        encode_chat(tokenizer, [messages[0], {"role": "tool", "content": "x"}])


def test_packed_examples_cannot_see_each_other(chat):
    tokenizer = load_tokenizer(chat.path)
    examples = [encode_chat(tokenizer, [{"role": "user", "content": q}, {"role": "assistant", "content": a}])
                for q, a in (("Add 2 and 3.", "print(2 + 3)"), ("Ava has 4 apples.", "apples = 4"), ("x" * 300, "y"))]
    lengths = [len(e.ids) for e in examples]
    packed = pack(examples, ["a", "b", "c"], seq_len=lengths[0] + lengths[1] + 3, pad_id=1)
    assert packed.dropped == 1 and packed.example_ids == [["a", "b"]]  # c is longer than a row: left out, counted
    row = packed.tokens[0]
    assert list(row[:lengths[0]]) == examples[0].ids and list(row[lengths[0]:sum(lengths[:2])]) == examples[1].ids
    assert list(packed.segments[0]) == [0] * lengths[0] + [1] * lengths[1] + [-1] * 3
    # target t + 1 counts exactly where the token t + 1 is an answer token
    assert list(packed.loss_mask[0]) == (examples[0].mask + examples[1].mask + [False] * 4)[1:]

    torch.manual_seed(0)
    model = Transformer(ModelConfig(vocab_size=chat.vocab_size, d_model=32, n_layers=2, n_heads=4, max_seq_len=128)).eval()
    with torch.no_grad():
        together = model(torch.from_numpy(packed.tokens[:, :-1]), torch.from_numpy(packed.segments))
        alone = model(torch.tensor([examples[1].ids]))
    torch.testing.assert_close(together[0, lengths[0]:sum(lengths[:2])], alone[0], atol=2e-5, rtol=1e-5)


def test_the_masked_loss_does_not_depend_on_the_micro_batching():
    from factory.train.distributed import Dist

    torch.manual_seed(0)
    model = Transformer(ModelConfig(vocab_size=50, d_model=32, n_layers=1, n_heads=2, max_seq_len=16))
    tokens = torch.randint(0, 50, (4, 13))
    mask = torch.zeros(4, 12, dtype=torch.bool)
    mask[0, 3:] = True
    mask[3, 10:] = True  # rows with very different answer lengths
    segments = torch.zeros(4, 12, dtype=torch.long)
    losses, grads = [], []
    for micro in (4, 2, 1):
        model.zero_grad()
        losses.append(_forward_backward(model, tokens, micro, Dist(0, 1, 0, torch.device("cpu")), torch.autocast("cpu", enabled=False), 1.0,
                                        mask, segments))
        grads.append(model.embed_tokens.weight.grad.clone())
    logits = model(tokens[:, :-1])
    want = torch.nn.functional.cross_entropy(logits[mask], tokens[:, 1:][mask]).item()
    assert losses == pytest.approx([want] * 3, rel=1e-5)
    torch.testing.assert_close(grads[1], grads[0], atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(grads[2], grads[0], atol=1e-6, rtol=1e-5)


def _porting_rows(lake, count: int) -> None:
    now = dt.datetime.now(dt.timezone.utc)
    rows = []
    for p in word_problems(count):
        text = port_to_python(p)
        rows.append({"doc_id": p["id"], "source": "porting", "path": p["id"], "text": text, "language": "python",
                     "kind": "code", "bytes": len(text), "content_sha256": "0" * 64, "seed_id": p["id"],
                     "agent_chain": ["port"], "export_id": None, "template_hash": "t", "verdicts": "{}",
                     "attempts": 1, "batch_id": "b", "fields": json.dumps({"question": p["question"]}),
                     "created_at": now})
    lake.commit("synthetic.porting", pa.Table.from_pylist(rows, schema=SYNTHETIC_DOCUMENTS.as_arrow()),
                CommitStamp(asset_key="test", config_hash=""), schema=SYNTHETIC_DOCUMENTS)


def test_examples_keep_provenance_and_the_loader_resumes_where_it_stopped(lake, chat):
    _porting_rows(lake, 60)
    version = build_examples(lake, "porting")
    assert version.new and version.rows == 60
    assert build_examples(lake, "porting").version_id == version.version_id  # same source snapshot: nothing to do
    rows = lake.table("sft.examples").scan().to_arrow().to_pylist()
    source = lake.table("synthetic.porting").current_snapshot().snapshot_id
    assert {(r["source_table"], r["source_snapshot"]) for r in rows} == {("synthetic.porting", source)}
    assert sorted(r["source_id"] for r in rows) == sorted(p["id"] for p in word_problems(60))
    first = rows[0]
    assert json.loads(first["messages"])[1] == {"role": "assistant", "content": first["response"]}
    [record] = lake.lineage.records(version_id=version.version_id)
    assert record.upstream == [f"synthetic.porting@{source}"]

    held = read_examples(lake, version.version_id, "porting", heldout_fraction=0.2, heldout=True)
    train = read_examples(lake, version.version_id, "porting", heldout_fraction=0.2, heldout=False)
    assert 0 < len(held) < 25 and len(held) + len(train) == 60 and not {e["example_id"] for e in held} & \
        {e["example_id"] for e in train}

    tokenizer = load_tokenizer(chat.path)
    longest = max(len(e.ids) for e in encode_examples(tokenizer, train))

    def loader(state=None):
        return SFTLoader(lake, version, tokenizer, dataset="porting", seq_len=2 * longest, global_batch=4, seed=1,
                         heldout_fraction=0.2, state=state)

    straight = loader()
    batches = [straight.next_batch() for _ in range(12)]  # several epochs
    resumed = loader()
    for _ in range(5):
        resumed.next_batch()
    again = loader(resumed.state_dict())
    for want in batches[5:]:
        got = again.next_batch()
        assert torch.equal(got.tokens, want.tokens) and torch.equal(got.loss_mask, want.loss_mask)
        assert got.doc_ids == want.doc_ids and got.version_id == version.version_id
    seen = {i for b in batches for row in b.doc_ids for i in row}
    assert seen == {e["example_id"] for e in train}  # every training example, no held-out one
    with pytest.raises(ValueError, match="must continue on the examples it started with"):
        loader({"step": 1, "version": "sft.examples@1"})


def test_bad_configs_name_the_field():
    from pydantic import ValidationError

    base = {"name": "s", "start": "ckpt/smoke@120", "steps": 4}
    for change, field in (({"data": "nope"}, "unknown dataset 'nope'"), ({"start": "smoke"}, "start='smoke'"),
                          ({"global_batch": 6, "micro_batch": 4}, "global_batch=6 must be a multiple"),
                          ({"eval_suite": "nope"}, "unknown eval suite 'nope'")):
        with pytest.raises(ValidationError, match=field):
            SFTConfig.model_validate({**base, **change})


@pytest.mark.parametrize("vocab, tokenizer_vocab", [(40, 40), (48, 40)])  # a model vocabulary with spare rows, too
def test_start_weights_keep_every_old_row_and_give_the_chat_tokens_the_mean(tmp_path, vocab, tokenizer_vocab):
    from types import SimpleNamespace

    from factory.posttrain.sft.run import start_weights
    from factory.train import checkpoint as ckpt

    torch.manual_seed(0)
    config = ModelConfig(vocab_size=vocab, d_model=16, n_layers=1, n_heads=2, max_seq_len=16, tie_embeddings=False)
    model = Transformer(config).eval()
    ref = ckpt.save_checkpoint(tmp_path, 1, {"model": model.state_dict()}, run="r", tokens=0, loss=None)
    new_ids = [tokenizer_vocab, tokenizer_vocab + 1, tokenizer_vocab + 2]
    grown_vocab = max(vocab, tokenizer_vocab + 3)
    state = start_weights(SimpleNamespace(ref=ref, plan=SimpleNamespace(model=config)), grown_vocab, new_ids)
    old = model.state_dict()
    for key in ("embed_tokens.weight", "lm_head.weight"):
        assert state[key].shape == (grown_vocab, 16)
        kept = [i for i in range(vocab) if i not in new_ids]
        assert torch.equal(state[key][kept], old[key][kept])
        mean = old[key][:tokenizer_vocab].mean(0)
        assert all(torch.equal(state[key][i], mean) for i in new_ids)
    grown = Transformer(config.model_copy(update={"vocab_size": grown_vocab})).eval()
    grown.load_state_dict(state)
    ids = torch.randint(0, tokenizer_vocab, (1, 8))
    with torch.no_grad():
        torch.testing.assert_close(grown(ids)[..., :tokenizer_vocab], model(ids)[..., :tokenizer_vocab])
