"""grpokit.data.prompts through datasets.load_dataset: hub-layout folders, globs, config/split, and the errors.

Offline: a local folder laid out as a hub dataset repository stands for a hub id."""

import json
import os
import subprocess
import sys

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from grpokit.data.prompts import DataError, load_prompts

pytest.importorskip("datasets")

TRAIN = [
    {"prompt": [{"role": "user", "content": "2 + 2?"}], "solution": "4"},
    {"prompt": [{"role": "user", "content": "3 + 5?"}], "solution": "8"},
]
TEST = [{"prompt": [{"role": "user", "content": "1 + 1?"}], "solution": "2"}]


def write_parquet(path, rows):
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows), path)


def write_jsonl(path, rows):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


@pytest.fixture
def hub_folder(tmp_path):
    """What `huggingface-cli download --repo-type dataset` leaves: data/<split>-XXXXX-of-NNNNN.parquet."""
    root = tmp_path / "gsm8k_like"
    write_parquet(root / "data" / "train-00000-of-00001.parquet", TRAIN)
    write_parquet(root / "data" / "test-00000-of-00001.parquet", TEST)
    (root / "README.md").write_text("# a dataset card\n")
    return root


def test_hub_layout_folder_reads_train_by_default_and_any_split(hub_folder):
    assert load_prompts(hub_folder) == TRAIN
    assert load_prompts(hub_folder, split="test") == TEST
    assert load_prompts(hub_folder, default_split="test") == TEST  # what evaluation asks for


def test_hub_layout_folder_of_jsonl_named_by_split(tmp_path):
    write_jsonl(tmp_path / "d" / "train.jsonl", TRAIN)
    write_jsonl(tmp_path / "d" / "test.jsonl", TEST)
    assert load_prompts(tmp_path / "d", split="test") == TEST


def test_glob_of_data_files(hub_folder):
    assert load_prompts(f"{hub_folder}/data/train-*.parquet") == TRAIN
    assert load_prompts(f"{hub_folder}/data/*.parquet", limit=1) == TEST  # files in name order: test-* first


def test_config_names_a_subset(tmp_path):
    """A hub repository with two configurations declared in its README, as openai/gsm8k has main/socratic."""
    root = tmp_path / "two_configs"
    write_parquet(root / "main" / "train-00000-of-00001.parquet", TRAIN)
    write_parquet(root / "socratic" / "train-00000-of-00001.parquet", TEST)
    (root / "README.md").write_text(
        "---\nconfigs:\n"
        "- config_name: main\n  data_files:\n  - split: train\n    path: main/train-*\n"
        "- config_name: socratic\n  data_files:\n  - split: train\n    path: socratic/train-*\n---\n"
    )
    assert load_prompts(root, config="main") == TRAIN
    assert load_prompts(root, config="socratic") == TEST
    with pytest.raises(DataError, match=r"two_configs \(config 'nope'\): datasets.load_dataset failed"):
        load_prompts(root, config="nope")


def test_unknown_split_lists_the_splits(hub_folder):
    with pytest.raises(DataError, match=r"no split 'dev'; splits found: \['train', 'test'\]"):
        load_prompts(hub_folder, split="dev")


def test_config_on_a_local_file_is_refused(tmp_path):
    write_jsonl(tmp_path / "d.jsonl", TRAIN)
    with pytest.raises(DataError, match=r"d\.jsonl: data\.config='main' .* drop data\.config"):
        load_prompts(tmp_path / "d.jsonl", config="main")


def test_bad_row_is_named_with_its_index_and_column(tmp_path):
    write_parquet(tmp_path / "d" / "data" / "train-0.parquet", [{"prompt": "ok"}, {"prompt": "  "}])
    with pytest.raises(DataError, match=r"d, row index 1: 'prompt' is an empty string"):
        load_prompts(tmp_path / "d")
    with pytest.raises(DataError, match=r"no prompt column 'question'; columns found: \['prompt'\]"):
        load_prompts(tmp_path / "d", prompt_column="question")


def test_glob_matching_nothing(tmp_path):
    with pytest.raises(DataError, match=r"nothing-\*\.jsonl: no file matches this pattern"):
        load_prompts(f"{tmp_path}/nothing-*.jsonl")


def test_save_to_disk_folder_still_read_by_the_local_reader(tmp_path):
    import datasets

    datasets.Dataset.from_list(TRAIN).save_to_disk(str(tmp_path / "saved"))
    assert load_prompts(tmp_path / "saved") == TRAIN


@pytest.mark.slow
def test_unknown_hub_id_offline_names_both_readings(tmp_path):
    """A name that is neither a local path nor a loadable hub dataset (offline: the hub is not asked)."""
    code = (
        "from grpokit.data.prompts import load_prompts, DataError\n"
        "try:\n    load_prompts('someone/no-such-dataset')\nexcept DataError as e:\n    print(e)\n"
    )
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_CACHE": str(tmp_path / "cache")}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=tmp_path)
    assert out.stdout.startswith(
        f"someone/no-such-dataset: not a local file or folder (looked in {tmp_path}/someone/no-such-dataset), "
        "and not a hub dataset that could be loaded (ConnectionError: "
    ), out.stdout + out.stderr
    assert "check the path, or the hub id and the network" in out.stdout


@pytest.mark.slow
def test_unknown_hub_id_without_a_hub_fails_in_seconds(tmp_path):
    """No hub at HF_ENDPOINT (a closed local port): the probe switches offline mode on, so datasets reads
    its cache once instead of retrying for ~23 s (1 + 2 + 4 + 8 + 8 s of backoff), and the error says why."""
    import socket

    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    port = closed.getsockname()[1]
    closed.close()  # nothing listens there now: connections are refused
    code = (
        "import time\nfrom grpokit.data.prompts import load_prompts, DataError\nstart = time.monotonic()\n"
        "try:\n    load_prompts('someone/no-such-dataset')\nexcept DataError as e:\n    print(e)\n"
        "print(f'took {time.monotonic() - start:.1f}')\n"
    )
    env = {**os.environ, "HF_ENDPOINT": f"http://127.0.0.1:{port}", "HF_DATASETS_CACHE": str(tmp_path / "cache")}
    for name in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE", "HTTPS_PROXY", "https_proxy"):
        env.pop(name, None)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=tmp_path)
    message, took = out.stdout.strip().splitlines()
    assert message.startswith("someone/no-such-dataset: not a local file or folder"), out.stdout + out.stderr
    assert f"the hub (http://127.0.0.1:{port}) gave no answer within 3 s and the datasets cache holds no copy" in message
    assert f"hub (http://127.0.0.1:{port}) cannot be reached" in out.stderr
    assert float(took.split()[1]) < 12.0  # the retries alone would take ~23 s


def test_the_hub_probe_switches_offline_mode_on_only_without_a_hub(monkeypatch):
    import socket

    from grpokit.core import hub

    for name in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE", "HTTPS_PROXY", "https_proxy"):
        monkeypatch.delenv(name, raising=False)
    import datasets.config
    import huggingface_hub.constants

    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", False)  # each restored after the test
    monkeypatch.setattr(datasets.config, "HF_DATASETS_OFFLINE", False)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        listening.listen(1)
        monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{listening.getsockname()[1]}")
        assert hub.go_offline_if_unreachable("x") is False  # a hub answers: nothing changes
        assert os.environ.get("HF_HUB_OFFLINE") is None and datasets.config.HF_HUB_OFFLINE is False
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")  # restored by monkeypatch after the switch below
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # the discard port: nothing listens
    assert hub.go_offline_if_unreachable("x") is True
    assert os.environ["HF_HUB_OFFLINE"] == "1"
    assert datasets.config.HF_HUB_OFFLINE is True and huggingface_hub.constants.HF_HUB_OFFLINE is True


def test_unparsable_file_in_a_hub_layout_folder(tmp_path):
    (tmp_path / "d" / "data").mkdir(parents=True)
    (tmp_path / "d" / "data" / "train.jsonl").write_text('{"prompt": "a"}\n{"prompt": "b",\n')
    with pytest.raises(
        DataError, match=r"d: datasets.load_dataset cannot read a file in it \(ArrowInvalid: JSON"
    ):
        load_prompts(tmp_path / "d")
