"""grpokit.data.prompts: every format from a real file in tmp_path, and one test per kind of bad input."""

import csv
import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from grpokit.data.prompts import DataError, load_prompts, prompt_problem, require_columns

ROWS = [
    {"prompt": "What is 2 + 2?", "answer": "4"},
    {"prompt": "What is 3 + 5?", "answer": "8"},
]
CHAT_ROWS = [
    {
        "prompt": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2 + 2?"}],
        "answer": "4",
    },
    {"prompt": [{"role": "user", "content": "3 + 5?"}], "answer": "8"},
]


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def write_arrow_stream(path, rows):
    table = pa.Table.from_pylist(rows)
    with pa.ipc.new_stream(path, table.schema) as writer:
        writer.write_table(table)


# ---- formats ---------------------------------------------------------------------------------


def test_jsonl(tmp_path):
    assert load_prompts(write_jsonl(tmp_path / "d.jsonl", ROWS)) == ROWS


def test_jsonl_skips_blank_lines_and_keeps_extra_columns(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text(
        '{"prompt": "a", "answer": "1", "level": 3}\n\n{"prompt": "b", "answer": "2", "level": 5}\n'
    )
    assert load_prompts(path) == [
        {"prompt": "a", "answer": "1", "level": 3},
        {"prompt": "b", "answer": "2", "level": 5},
    ]


def test_jsonl_chat_messages(tmp_path):
    assert load_prompts(write_jsonl(tmp_path / "d.jsonl", CHAT_ROWS)) == CHAT_ROWS


def test_json_list(tmp_path):
    path = tmp_path / "d.json"
    path.write_text(json.dumps(ROWS))
    assert load_prompts(path) == ROWS


def test_json_data_key(tmp_path):
    path = tmp_path / "d.json"
    path.write_text(json.dumps({"data": ROWS}))
    assert load_prompts(path) == ROWS


def test_json_splits(tmp_path):
    path = tmp_path / "d.json"
    path.write_text(json.dumps({"test": ROWS[1:], "train": ROWS[:1]}))
    assert load_prompts(path) == ROWS[:1]  # "train" by default
    assert load_prompts(path, split="test") == ROWS[1:]
    with pytest.raises(DataError, match=r"d\.json: no split 'dev'; splits found: \['test', 'train'\]"):
        load_prompts(path, split="dev")


def test_json_splits_without_train_need_a_choice(tmp_path):
    path = tmp_path / "d.json"
    path.write_text(json.dumps({"a": ROWS, "b": ROWS}))
    with pytest.raises(DataError, match=r"has splits \['a', 'b'\] and none is 'train'"):
        load_prompts(path)


def test_json_columns(tmp_path):
    path = tmp_path / "d.json"
    path.write_text(json.dumps({"prompt": ["What is 2 + 2?", "What is 3 + 5?"], "answer": ["4", "8"]}))
    assert load_prompts(path) == ROWS


def test_json_lines_saved_as_json(tmp_path):
    assert load_prompts(write_jsonl(tmp_path / "d.json", ROWS)) == ROWS


def test_csv_values_are_strings(tmp_path):
    path = tmp_path / "d.csv"
    path.write_text('prompt,answer\n"What is 2 + 2?",4\n"Say ""hi"", then stop",hi\n')
    assert load_prompts(path) == [
        {"prompt": "What is 2 + 2?", "answer": "4"},
        {"prompt": 'Say "hi", then stop', "answer": "hi"},
    ]


def test_tsv(tmp_path):
    path = tmp_path / "d.tsv"
    path.write_text("prompt\tanswer\nWhat is 2 + 2?\t4\n")
    assert load_prompts(path) == ROWS[:1]


def test_parquet_with_chat_messages(tmp_path):
    path = tmp_path / "d.parquet"
    pq.write_table(pa.Table.from_pylist(CHAT_ROWS), path)
    assert load_prompts(path) == CHAT_ROWS


def test_arrow_stream_folder_read_without_datasets(tmp_path):
    # What save_to_disk writes, by hand: shards listed in state.json, read in that order.
    folder = tmp_path / "saved"
    folder.mkdir()
    write_arrow_stream(folder / "data-00000-of-00002.arrow", ROWS[:1])
    write_arrow_stream(folder / "data-00001-of-00002.arrow", ROWS[1:])
    shards = [{"filename": "data-00000-of-00002.arrow"}, {"filename": "data-00001-of-00002.arrow"}]
    (folder / "state.json").write_text(json.dumps({"_data_files": shards, "_split": None}))
    (folder / "dataset_info.json").write_text("{}")
    assert load_prompts(folder) == ROWS


def test_arrow_stream_dataset_dict_folder(tmp_path):
    for split, rows in (("train", ROWS[:1]), ("test", ROWS[1:])):
        (tmp_path / split).mkdir()
        write_arrow_stream(tmp_path / split / "data-00000-of-00001.arrow", rows)
        (tmp_path / split / "state.json").write_text(
            json.dumps({"_data_files": [{"filename": "data-00000-of-00001.arrow"}]})
        )
    (tmp_path / "dataset_dict.json").write_text(json.dumps({"splits": ["train", "test"]}))
    assert load_prompts(tmp_path) == ROWS[:1]
    assert load_prompts(tmp_path, split="test") == ROWS[1:]
    with pytest.raises(DataError, match=r"no split 'validation'; splits found: \['train', 'test'\]"):
        load_prompts(tmp_path, split="validation")


def test_arrow_file_format(tmp_path):
    path = tmp_path / "d.arrow"
    table = pa.Table.from_pylist(ROWS)
    with pa.ipc.new_file(path, table.schema) as writer:
        writer.write_table(table)
    assert load_prompts(path) == ROWS


def test_save_to_disk_dataset_and_dataset_dict(tmp_path):
    datasets = pytest.importorskip("datasets")
    dataset = datasets.Dataset.from_list(CHAT_ROWS + CHAT_ROWS)
    dataset.select([3, 0]).save_to_disk(tmp_path / "one")  # save_to_disk flattens the indices
    assert load_prompts(tmp_path / "one") == [CHAT_ROWS[1], CHAT_ROWS[0]]
    datasets.DatasetDict(train=dataset.select([0]), test=dataset.select([1])).save_to_disk(tmp_path / "dict")
    assert load_prompts(tmp_path / "dict") == CHAT_ROWS[:1]
    assert load_prompts(tmp_path / "dict", split="test") == CHAT_ROWS[1:2]


def test_limit_keeps_first_rows_and_checks_only_those(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", [*ROWS, {"prompt": 7}])
    assert load_prompts(path, limit=1) == ROWS[:1]
    with pytest.raises(ValueError, match="limit must be a positive integer"):
        load_prompts(path, limit=0)


def test_prompt_column(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", [{"question": "q?", "answer": "a"}])
    assert load_prompts(path, prompt_column="question") == [{"question": "q?", "answer": "a"}]


# ---- bad input -------------------------------------------------------------------------------


def test_missing_file(tmp_path):
    with pytest.raises(DataError, match=r"nope\.jsonl: no such file or folder .*check the path"):
        load_prompts(tmp_path / "nope.jsonl")


def test_unknown_format(tmp_path):
    path = tmp_path / "d.txt"
    path.write_text("What is 2 + 2?\n")
    with pytest.raises(DataError, match=r"d\.txt: unknown data format '\.txt'; use JSON Lines \(\.jsonl"):
        load_prompts(path)


def test_folder_not_from_save_to_disk(tmp_path):
    with pytest.raises(DataError, match="not one written by datasets' save_to_disk"):
        load_prompts(tmp_path)


def test_malformed_jsonl_line(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text('{"prompt": "a"}\n\n{"prompt": "b",\n')
    with pytest.raises(DataError, match=r"d\.jsonl, line 3: not valid JSON .*one complete JSON object"):
        load_prompts(path)


def test_malformed_json(tmp_path):
    path = tmp_path / "d.json"
    path.write_text('[{"prompt": "a"},\n {"prompt": }]')
    with pytest.raises(DataError, match=r"d\.json: not valid JSON \(Expecting value at line 2, column 13\)"):
        load_prompts(path)


def test_jsonl_line_that_is_not_an_object(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text('{"prompt": "a"}\n["b"]\n')
    with pytest.raises(
        DataError, match=r"d\.jsonl, line 2: expected an object with a 'prompt' field, got a list"
    ):
        load_prompts(path)


def test_missing_prompt_column_suggests_nearest(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", [{"promt": "a", "answer": "1"}])
    with pytest.raises(DataError) as error:
        load_prompts(path)
    assert str(error.value) == (
        f"{path}: no prompt column 'prompt'; columns found: ['promt', 'answer']. Did you mean 'promt'? "
        "Set prompt_column to the column that holds the prompts, or rename it."
    )


def test_missing_prompt_column_suggests_a_prompt_like_column(tmp_path):
    path = tmp_path / "d.csv"
    path.write_text("question,answer\nq?,a\n")
    with pytest.raises(
        DataError, match=r"columns found: \['question', 'answer'\]\. Did you mean 'question'\?"
    ):
        load_prompts(path)


def test_prompt_missing_from_one_row(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", [ROWS[0], {"answer": "8"}])
    with pytest.raises(DataError, match=r"d\.jsonl, line 2: no 'prompt' field \(this row has \['answer'\]\)"):
        load_prompts(path)


@pytest.mark.parametrize("name", ["d.jsonl", "d.json", "d.csv", "d.parquet"])
def test_empty_dataset(tmp_path, name):
    path = tmp_path / name
    if name == "d.json":
        path.write_text("[]")
    elif name == "d.csv":
        path.write_text("prompt,answer\n")
    elif name == "d.parquet":
        pq.write_table(pa.table({"prompt": pa.array([], pa.string())}), path)
    else:
        path.write_text("\n")
    with pytest.raises(DataError, match=rf"{name}: the dataset is empty"):
        load_prompts(path)


def test_prompt_neither_string_nor_messages(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", [ROWS[0], {"prompt": 42}])
    with pytest.raises(DataError) as error:
        load_prompts(path)
    assert str(error.value) == (
        f"{path}, line 2: 'prompt' must be a non-empty string or a list of chat messages "
        "[{'role': 'user', 'content': ...}], got int: 42."
    )


def test_empty_string_prompt_in_parquet_names_row_index(tmp_path):
    path = tmp_path / "d.parquet"
    pq.write_table(pa.Table.from_pylist([ROWS[0], {"prompt": "  ", "answer": "0"}]), path)
    with pytest.raises(DataError, match=r"d\.parquet, row index 1: 'prompt' is an empty string"):
        load_prompts(path)


def test_csv_error_names_row_index_and_line(tmp_path):
    path = tmp_path / "d.csv"
    path.write_text('prompt,answer\n"two\nlines",1\n,2\n')
    with pytest.raises(DataError, match=r"d\.csv, row index 1 \(line 4\): 'prompt' is an empty string"):
        load_prompts(path)


def test_csv_row_with_extra_fields(tmp_path):
    path = tmp_path / "d.csv"
    path.write_text("prompt,answer\nWhat is 1,000 + 1?,1001\n")
    with pytest.raises(DataError, match=r"row index 0 \(line 2\): more fields than the 2 header columns"):
        load_prompts(path)


def test_message_with_bad_role(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", [{"prompt": [{"role": "human", "content": "hi"}]}])
    with pytest.raises(DataError) as error:
        load_prompts(path)
    assert str(error.value) == (
        f"{path}, line 1: 'prompt' message 0 has role 'human'; use one of "
        "['system', 'developer', 'user', 'assistant', 'tool']."
    )


def test_message_without_content(tmp_path):
    rows = [{"prompt": [{"role": "system", "content": "Be brief."}, {"role": "user", "text": "hi"}]}]
    path = tmp_path / "d.json"
    path.write_text(json.dumps(rows))
    with pytest.raises(
        DataError, match=r"d\.json, row index 0: 'prompt' message 1 \(role 'user'\) has no 'content'"
    ):
        load_prompts(path)


def test_single_message_not_in_a_list(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", [{"prompt": {"role": "user", "content": "hi"}}])
    with pytest.raises(DataError, match="is a single message; wrap it in a list"):
        load_prompts(path)


def test_split_on_a_single_table(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", ROWS)
    assert load_prompts(path, split="train") == ROWS  # datasets' name for a lone file
    with pytest.raises(DataError, match=r"d\.jsonl: a single table has no split 'test'"):
        load_prompts(path, split="test")


def test_prompt_problem_accepts_valid_prompts():
    assert prompt_problem("hi") is None
    assert prompt_problem(CHAT_ROWS[0]["prompt"]) is None
    assert prompt_problem([]) is not None
    assert prompt_problem([{"role": "user", "content": ["part"]}]) is not None


# ---- require_columns -------------------------------------------------------------------------


def test_require_columns_passes():
    require_columns(ROWS, ["prompt", "answer"], "d.jsonl")


def test_require_columns_missing_everywhere():
    with pytest.raises(DataError) as error:
        require_columns(ROWS, ["answer", "solution"], "d.jsonl", needed_by="reward 'accuracy'")
    assert str(error.value) == (
        "d.jsonl: no column 'solution' (needed by reward 'accuracy'); columns present: ['prompt', 'answer']. "
        "Add the column to the dataset or rename it."
    )


def test_require_columns_suggests_nearest():
    with pytest.raises(
        DataError,
        match=r"no column 'answers'; columns present: \['prompt', 'answer'\]\. Did you mean 'answer'\?",
    ):
        require_columns(ROWS, ["answers"], "d.jsonl")


def test_require_columns_missing_from_one_row():
    with pytest.raises(
        DataError, match=r"d\.jsonl, row index 1: no 'answer' field; this row has \['prompt'\]"
    ):
        require_columns([ROWS[0], {"prompt": "x"}], ["answer"], "d.jsonl")


def test_csv_module_round_trip(tmp_path):
    # A file written by the csv module (quoting, embedded newlines) reads back unchanged.
    rows = [{"prompt": "line one\nline two, with comma", "answer": '"quoted"'}]
    path = tmp_path / "d.csv"
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=["prompt", "answer"])
        writer.writeheader()
        writer.writerows(rows)
    assert load_prompts(path) == rows
