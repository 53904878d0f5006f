"""The dataset reader on veRL and TRL rows (JSONL, JSON, parquet) and its errors; the synthetic
arithmetic task (deterministic, disjoint splits, veRL schema read back by the reader)."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from embodied.errors import UserError
from pipelines.reasoning.data import DataConfig, PromptRecord, lookup, read_records
from pipelines.reasoning.synthetic import ArithConfig, answer_text, make_arith_rows, write_arith_dataset
from pipelines.reasoning.verifiers import RewardFunction

VERL_ROW = {
    "data_source": "openai/gsm8k",
    "prompt": [{"role": "user", "content": "Natalia sold 48 clips ... after \"####\"."}],
    "ability": "math",
    "reward_model": {"style": "rule", "ground_truth": "72"},
    "extra_info": {"split": "train", "index": 0, "answer": "48/2 = 24 ... #### 72"},
}


def write_jsonl(path, rows) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_verl_jsonl_and_parquet_give_the_same_records(tmp_path) -> None:
    second = {**VERL_ROW, "reward_model": {"style": "rule", "ground_truth": "5"}, "extra_info": {"split": "train", "index": 1, "answer": "x"}}
    write_jsonl(tmp_path / "d.jsonl", [VERL_ROW, second])
    pq.write_table(pa.Table.from_pylist([VERL_ROW, second]), tmp_path / "d.parquet")
    from_jsonl, from_parquet = read_records(tmp_path / "d.jsonl"), read_records(tmp_path / "d.parquet")
    assert from_jsonl == from_parquet
    first = from_jsonl[0]
    assert first == PromptRecord(
        uid="d/0",
        prompt=VERL_ROW["prompt"],
        ground_truth="72",
        data_source="openai/gsm8k",
        extras={"data_source": "openai/gsm8k", "ability": "math", "split": "train", "index": 0, "answer": "48/2 = 24 ... #### 72"},
    )
    assert [r.uid for r in from_jsonl] == ["d/0", "d/1"] and from_jsonl[1].ground_truth == "5"


def test_trl_prompt_only_rows(tmp_path) -> None:
    rows = [
        {"prompt": "What is 2+2?", "solution": "4", "task": "add"},
        {"prompt": [{"role": "user", "content": "3*3?"}], "solution": 9},  # a number answer becomes text
    ]
    write_jsonl(tmp_path / "trl.jsonl", rows)
    records = read_records(tmp_path / "trl.jsonl", DataConfig(default_data_source="synthetic/trl"))
    assert records[0].prompt == "What is 2+2?" and records[0].ground_truth == "4"
    assert records[0].extras == {"task": "add"} and records[0].data_source == "synthetic/trl"
    assert records[1].prompt == [{"role": "user", "content": "3*3?"}] and records[1].ground_truth == "9"
    # ... and the records score through the data_source dispatch.
    batch = RewardFunction()(["4", "8"], [r.ground_truth for r in records], [r.data_source for r in records])
    assert [r.acc for r in batch.results] == [True, False]


def test_configurable_dotted_fields_and_json_arrays(tmp_path) -> None:
    rows = [{"q": {"text": "1+1="}, "solutions": ["2", "two"], "src": "mine", "qid": "a"}]
    (tmp_path / "rows.json").write_text(json.dumps(rows))
    cfg = DataConfig(prompt_key="q.text", answer_keys=["solutions.0"], data_source_key="src", uid_key="qid")
    (record,) = read_records([tmp_path / "rows.json"], cfg)
    assert (record.uid, record.prompt, record.ground_truth, record.data_source) == ("a", "1+1=", "2", "mine")
    assert lookup(rows[0], "solutions.-1") == "two"


def test_missing_file_and_unknown_type(tmp_path) -> None:
    with pytest.raises(UserError, match="does not exist"):
        read_records(tmp_path / "nope.jsonl")
    (tmp_path / "d.csv").write_text("a,b\n")
    with pytest.raises(UserError, match=r"unknown type; use one of \.jsonl, \.json, \.parquet"):
        read_records(tmp_path / "d.csv")


def test_bad_jsonl_line_is_named(tmp_path) -> None:
    (tmp_path / "d.jsonl").write_text(json.dumps(VERL_ROW) + "\n\n" + '{"prompt": "x", \n')
    with pytest.raises(UserError, match=r"d\.jsonl: line 3 is not valid JSON"):
        read_records(tmp_path / "d.jsonl")
    (tmp_path / "e.jsonl").write_text(json.dumps(VERL_ROW) + "\n[1, 2]\n")
    with pytest.raises(UserError, match=r"e\.jsonl: line 2 is a list, not an object"):
        read_records(tmp_path / "e.jsonl")


def test_damaged_parquet(tmp_path) -> None:
    (tmp_path / "d.parquet").write_bytes(b"PAR1 this is not parquet")
    with pytest.raises(UserError, match="not a readable parquet file"):
        read_records(tmp_path / "d.parquet")


def test_missing_fields_name_the_field_and_the_keys_that_exist(tmp_path) -> None:
    row = {**VERL_ROW, "reward_model": {"style": "rule", "truth": "72"}}
    pq.write_table(pa.Table.from_pylist([VERL_ROW, row]), tmp_path / "d.parquet")
    with pytest.raises(UserError) as err:
        read_records(tmp_path / "d.parquet")
    message = str(err.value)
    assert "row 1" in message and "reward_model.ground_truth" in message and "data.answer_keys" in message
    assert "'reward_model.ground_truth' is null" in message  # parquet fills a missing field with null
    assert "Row keys: data_source, prompt, ability, reward_model, extra_info" in message
    write_jsonl(tmp_path / "a.jsonl", [row])
    with pytest.raises(UserError, match=r"no key 'ground_truth' under 'reward_model'\. Did you mean 'truth'\? Keys there: style, truth"):
        read_records(tmp_path / "a.jsonl")
    write_jsonl(tmp_path / "p.jsonl", [{"promt": "x", "answer": "1"}])
    with pytest.raises(UserError) as err:
        read_records(tmp_path / "p.jsonl")
    assert "line 1: no field 'prompt'" in str(err.value) and "Did you mean 'promt'" in str(err.value)
    # a dotted path that ends early names where it stopped
    with pytest.raises(UserError, match="no key 'text' under 'q'.*Keys there: txt"):
        write_jsonl(tmp_path / "q.jsonl", [{"q": {"txt": "x"}, "answer": "1"}])
        read_records(tmp_path / "q.jsonl", DataConfig(prompt_key="q.text"))


def test_bad_prompts_answers_and_duplicate_uids(tmp_path) -> None:
    cases = [
        ({"prompt": "", "answer": "1"}, "prompt .* is empty"),
        ({"prompt": [{"role": "user"}], "answer": "1"}, "message 0 of the prompt"),
        ({"prompt": 5, "answer": "1"}, "must be a string or a non-empty list"),
        ({"prompt": "x", "answer": ["1", "2"]}, "not a single answer.*'answer.0'"),
    ]
    for i, (row, pattern) in enumerate(cases):
        write_jsonl(tmp_path / f"c{i}.jsonl", [row])
        with pytest.raises(UserError, match=pattern):
            read_records(tmp_path / f"c{i}.jsonl")
    write_jsonl(tmp_path / "dup.jsonl", [{"prompt": "x", "answer": "1", "id": 3}, {"prompt": "y", "answer": "2", "id": 3}])
    with pytest.raises(UserError, match="share the uid '3'"):
        read_records(tmp_path / "dup.jsonl", DataConfig(uid_key="id"))


# -- the synthetic task ---------------------------------------------------------------------------------------


def test_answer_text() -> None:
    assert answer_text(132, reverse=True) == "231"
    assert answer_text(100, reverse=True) == "001"
    assert answer_text(-12, reverse=True) == "-21"
    assert answer_text(132, reverse=False) == "132"


def test_synthetic_splits_are_deterministic_disjoint_and_complete() -> None:
    rows = make_arith_rows(ArithConfig(digits=2, test_size=500, seed=3))
    assert len(rows["test"]) == 500 and len(rows["train"]) == 10_000 - 500
    assert rows == make_arith_rows(ArithConfig(digits=2, test_size=500, seed=3))
    assert rows["test"] != make_arith_rows(ArithConfig(digits=2, test_size=500, seed=4))["test"]
    problems = {split: {r["prompt"][0]["content"] for r in split_rows} for split, split_rows in rows.items()}
    assert not problems["train"] & problems["test"] and len(problems["train"] | problems["test"]) == 10_000
    for row in rows["test"][:50]:
        info = row["extra_info"]
        assert row["prompt"][0]["content"] == f"{info['a']}+{info['b']}="
        assert row["reward_model"]["ground_truth"] == str(info["a"] + info["b"])[::-1]
        assert row["data_source"] == "synthetic/arith"


def test_synthetic_files_read_back(tmp_path) -> None:
    cfg = ArithConfig(digits=1, operations=["+", "*", "-"], test_size=20, train_size=50, reverse_answer=False)
    for fmt in ("jsonl", "parquet"):
        paths = write_arith_dataset(tmp_path / fmt, cfg, fmt=fmt)
        train, test = read_records(paths["train"]), read_records(paths["test"])
        assert len(train) == 50 and len(test) == 20
        for record in train + test:
            info = record.extras
            expected = {"+": info["a"] + info["b"], "*": info["a"] * info["b"], "-": info["a"] - info["b"]}[info["op"]]
            assert record.ground_truth == str(expected) and record.data_source == "synthetic/arith"
    assert read_records(tmp_path / "jsonl" / "test.jsonl") == read_records(tmp_path / "parquet" / "test.parquet")


def test_zero_padded_format() -> None:
    rows = make_arith_rows(ArithConfig(digits=2, zero_pad=True, test_size=10_000 - 1))
    by_prompt = {r["prompt"][0]["content"]: r["reward_model"]["ground_truth"] for r in rows["train"] + rows["test"]}
    assert by_prompt["04+21="] == "520"  # 25 -> "025" -> reversed
    assert by_prompt["99+99="] == "891"
    assert by_prompt["00+00="] == "000"
    multiply = make_arith_rows(ArithConfig(digits=1, operations=["*", "-"], zero_pad=True, reverse_answer=False, test_size=10))
    answers = {r["prompt"][0]["content"]: r["reward_model"]["ground_truth"] for r in multiply["train"] + multiply["test"]}
    assert answers["3*4="] == "12" and answers["2*3="] == "06" and answers["2-7="] == "-5"


def test_synthetic_config_errors() -> None:
    with pytest.raises(UserError, match="does not fit"):
        make_arith_rows(ArithConfig(digits=1, test_size=100))
    with pytest.raises(UserError, match="operations"):
        make_arith_rows(ArithConfig(operations=["/"]))
