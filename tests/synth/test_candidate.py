"""The typed synthetic candidate (`factory.synth.candidate.Candidate`): frozen (a stage returns the
next candidate and leaves the one it was given as it was, fields included), provenance carried
along (chain, attempts, loop rounds and turns), and its rows are exactly the columns of
`synthetic.<name>` and `synthetic.<name>_rejected`. Unit tier, no lake; well under a second."""

import dataclasses
import datetime as dt
import json

import pyarrow as pa
import pytest

from factory.lake.schemas import SYNTHETIC_DOCUMENTS, SYNTHETIC_REJECTED
from factory.synth.candidate import Candidate

NOW = dt.datetime(2025, 1, 1, tzinfo=dt.timezone.utc)


def test_a_stage_returns_a_new_candidate_and_leaves_its_input_alone():
    seed = {"id": "s1", "topic": "parsing"}
    first = Candidate("s1", seed)
    seed["topic"] = "changed by the caller"  # the candidate took a copy
    second = first.tried(2).generated("draft", "draft", "a draft")
    assert dict(first.fields) == {"id": "s1", "topic": "parsing"} and first.chain == () and first.attempts == 0
    assert dict(second.fields) == {"id": "s1", "topic": "parsing", "draft": "a draft"}
    assert (second.chain, second.attempts) == (("draft",), 2)
    with pytest.raises(dataclasses.FrozenInstanceError):
        second.attempts = 5
    with pytest.raises(TypeError):
        second.fields["draft"] = "edited in place"


def test_loop_counts_and_field_order_survive_updates():
    c = Candidate("s1", {"id": "s1"}).with_fields(instructions="Improve it.", score=3.0)
    c = c.took_turn("judge").took_turn("judge").next_round().without("instructions")
    assert (dict(c.runs), c.rounds, c.chain) == ({"judge": 2}, 1, ("judge", "judge"))
    assert list(c.fields) == ["id", "score"]  # the fields JSON keeps the order stages wrote them in
    assert c.with_fields(id="s1", extra=1).fields_json() == '{"id": "s1", "score": 3.0, "extra": 1}'


def test_rows_have_exactly_the_tables_columns():
    c = Candidate("wp-1", {"id": "wp-1", "question": "q"}).generated("port", "program", "print(1)\n")
    c = c.rendered("print(1)\n").judged("sandbox", True).judged("python_syntax", True)
    accepted = c.accepted_row(pipeline="porting", kind="code", exports=[], templates="abc", batch_id="b1", now=NOW)
    rejected = c.rejected_row("sandbox", "x" * 3000, "b1", NOW)
    assert list(accepted) == SYNTHETIC_DOCUMENTS.as_arrow().names
    assert list(rejected) == SYNTHETIC_REJECTED.as_arrow().names
    pa.Table.from_pylist([accepted], schema=SYNTHETIC_DOCUMENTS.as_arrow())
    pa.Table.from_pylist([rejected], schema=SYNTHETIC_REJECTED.as_arrow())
    assert accepted["agent_chain"] == ["port"] and accepted["export_id"] is None
    assert json.loads(accepted["verdicts"]) == {"python_syntax": True, "sandbox": True}
    assert (accepted["bytes"], accepted["language"]) == (9, "python")
    assert len(rejected["reason"]) == 2000 and rejected["text"] == "print(1)\n"
