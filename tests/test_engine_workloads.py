"""Workload mixing: built-in sets, JSONL prompt files by path, labels and clear errors."""

from __future__ import annotations

import pytest

from acceptscope.domain.workloads import BUILTIN, load_prompts, parse_spec, read_turns_jsonl


def test_mixed_is_the_four_builtins_round_robin():
    ps = load_prompts("mixed", 10)
    assert parse_spec("mixed") == list(BUILTIN)
    assert [p.workload for p in ps[:4]] == list(BUILTIN)
    assert sorted({p.workload for p in ps}) == sorted(BUILTIN)
    assert all(p.text.strip() for p in ps)
    assert load_prompts("mixed", 10) == ps  # deterministic


def test_jsonl_by_path_is_read_and_labelled(tmp_path):
    f = tmp_path / "mine.jsonl"
    f.write_text('{"turns": ["first q", "follow-up"]}\n\n{"turns": ["second q"]}\n')
    ps = load_prompts(f"math,{f}", 6)
    mine = [p for p in ps if p.workload == "mine"]
    assert [p.text for p in mine] == ["first q", "second q", "first q"]  # short files cycle
    assert [p.prompt_index for p in mine] == [0, 1, 2]
    assert len([p for p in ps if p.workload == "math"]) == 3


def test_bad_jsonl_names_file_line_and_field(tmp_path):
    f = tmp_path / "bad.jsonl"
    f.write_text('{"turns": ["ok"]}\n{"turns": []}\n')
    with pytest.raises(ValueError, match=r"bad.jsonl: line 2: field turns"):
        read_turns_jsonl(f)
    f.write_text('{"turns": ["ok"]}\n{oops\n')
    with pytest.raises(ValueError, match=r"bad.jsonl: line 2: invalid JSON"):
        read_turns_jsonl(f)
    with pytest.raises(ValueError, match="unknown workload 'nosuch'"):
        load_prompts("nosuch", 3)


def test_eval_acceptance_reads_prompt_files_with_the_workload_reader(tmp_path):
    from acceptscope.domain import workloads
    from acceptscope.engine import eval_acceptance

    assert eval_acceptance.read_prompt_file is workloads.read_turns_jsonl  # one JSONL reader, not two
    p = tmp_path / "w.jsonl"
    p.write_text('{"turns": ["a"]}\n{"turns": ["b", "c"]}\n{"turns": "x"}\n')
    assert eval_acceptance.read_turns_jsonl(p, limit=2) == ["a", "b"]
    with pytest.raises(ValueError, match=r"w\.jsonl: line 3: field turns"):
        eval_acceptance.read_turns_jsonl(p)
