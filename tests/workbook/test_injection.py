"""A params file against the series (`workbook.injection`): what each notebook is injected, every
problem at once with a close match, each notebook's contract checks over its defaults, the
notebooks selected by `--only`, and parameters cells read without papermill as papermill reads them."""

from __future__ import annotations

from pathlib import Path

import pytest

from spirelib.training.params import ParamsError, load_params
from spirelib.workbook import injection

ROOT = Path(__file__).resolve().parents[2]
SERIES = ROOT / "tests" / "fixtures" / "notebooks"

DECLARED = {
    "01_perf": {"hoi": "float", "batch": "int", "device": "str"},
    "02_train": {"device": "str", "steps": "int", "fast": "bool", "sizes": "list[int]", "cut": "Optional[int]"},
}


def params(shared=None, notebooks=None):
    return {"shared": shared or {}, "notebooks": notebooks or {}}


def problems(excinfo) -> str:
    return str(excinfo.value)


# ---------------------------------------------------------------------------- params validation

def test_shared_keys_go_only_to_notebooks_that_declare_them_and_sections_override():
    resolved = injection.resolve(params({"device": "cpu", "steps": 5}, {"02_train": {"device": "cuda"}}), DECLARED)
    assert resolved == {"01_perf": {"device": "cpu"}, "02_train": {"device": "cuda", "steps": 5}}


def test_unknown_notebook_key_names_key_notebook_allowed_keys_and_a_close_match():
    with pytest.raises(ParamsError) as e:
        injection.resolve(params(notebooks={"01_perf": {"hio": 600.0}}), DECLARED, source="p.yaml")
    msg = problems(e)
    assert "notebooks.01_perf.hio" in msg and "did you mean 'hoi'" in msg
    assert "allowed: hoi, batch, device" in msg and msg.startswith("p.yaml: 1 problem")


def test_shared_key_declared_by_no_notebook_is_an_error():
    with pytest.raises(ParamsError) as e:
        injection.resolve(params({"devcie": "cpu"}), DECLARED)
    assert "shared.devcie" in problems(e) and "did you mean 'device'" in problems(e)


def test_the_series_section_goes_to_notebooks_declaring_series_and_is_checked_in_full():
    declared = {**DECLARED, "03_use": {"series": "dict", "steps": "int"}}
    p = {**params({"steps": 2}), "series": {"device": "cpu", "seed": 3}}
    resolved = injection.resolve(p, declared)
    assert resolved["03_use"] == {"series": {"device": "cpu", "seed": 3}, "steps": 2}
    assert "series" not in resolved["01_perf"]
    p = {**params({"series": {}}, {"03_use": {"series": {"sed": 1}}}), "series": {"devcie": "cpu", "target": 3}}
    with pytest.raises(ParamsError) as e:
        injection.resolve(p, declared)
    msg = problems(e)
    assert "series.devcie: not a series field (did you mean 'device'?)" in msg
    assert "series.target must be a mapping of ModelConfig fields, got int" in msg
    assert "shared.series: the series configuration is its own top-level section" in msg
    assert "notebooks.03_use.series.sed: not a series field (did you mean 'seed'?)" in msg


def test_section_for_a_missing_notebook_is_an_error():
    with pytest.raises(ParamsError) as e:
        injection.resolve(params(notebooks={"01_perfs": {"hoi": 1.0}}), DECLARED)
    assert "notebooks.01_perfs: no such notebook (did you mean '01_perf'?)" in problems(e)


@pytest.mark.parametrize("key,value,ok", [
    ("hoi", 600, True),          # an int where float is declared is fine
    ("hoi", "600", False),
    ("batch", 4.0, False),
    ("batch", True, False),      # bool is not an int here
    ("fast", 1, False),
    ("sizes", [1, 2], True),     # list[int]: checked as a list
    ("sizes", 3, False),
    ("cut", None, True),         # Optional accepts null
    ("cut", 3, True),
    ("cut", "3", False),
    ("steps", None, False),
])
def test_values_are_checked_against_annotated_types(key, value, ok):
    stem = "01_perf" if key in DECLARED["01_perf"] else "02_train"
    p = params(notebooks={stem: {key: value}})
    if ok:
        assert injection.resolve(p, DECLARED)[stem][key] == value
    else:
        with pytest.raises(ParamsError, match=f"notebooks.{stem}.{key}: expected"):
            injection.resolve(p, DECLARED)


def test_every_problem_is_reported_at_once():
    p = params({"nope": 1}, {"01_perf": {"hoi": "x", "zzz": 1}, "99_missing": {}})
    with pytest.raises(ParamsError) as e:
        injection.resolve(p, DECLARED)
    assert problems(e).count("\n  ") == 4


@pytest.mark.parametrize("params_file", sorted((ROOT / "params").glob("*.yaml")), ids=lambda p: p.name)
def test_committed_params_files_fit_the_series(params_file, tmp_path):
    notebooks = ROOT / "notebooks"
    series = injection.discover(notebooks) if notebooks.is_dir() else []
    declared = {p.stem: injection.declared_parameters(p) for p in series}
    params = load_params(params_file)
    if params["series"].get("target_source"):  # the user's checkpoint is not in the repository: a tiny stand-in
        from spirelib.model.config import ModelConfig
        from spirelib.model.transformer import Transformer
        from spirelib.training import hf_export

        layers = max(2, params["series"].get("spire", {}).get("num_layers", 1))  # llama3-70b.yaml's draft: 20
        stand_in = Transformer(ModelConfig(vocab_size=64, num_layers=layers, d_model=16, n_q_per_kv=1, n_kv=2,
                                           d_head=8, d_ff=32))
        params["series"]["target_source"] = f"hf:{hf_export.save_model(stand_in, tmp_path / 'target')}"
    injected = injection.resolve(params, declared, source=params_file.name)
    assert injection.consistency_problems(injected, {p.stem: injection.default_parameters(p) for p in series}) == []


def test_a_notebooks_parameters_are_checked_together_over_its_defaults_before_any_compute(tmp_path):
    """09's held-out cells must leave a grid that identifies the profiled model's fit: refused by
    `plan`, with the defaults of its parameters cell filling what the file leaves out."""
    notebooks = ROOT / "notebooks"
    assert injection.default_parameters(notebooks / "09_measured_vs_modeled.ipynb")["timing_contexts"] == [32, 64]
    bad = tmp_path / "bad.yaml"
    bad.write_text("notebooks:\n  09_measured_vs_modeled:\n    timing_batches: [1, 16]\n"
                   "    held_out: [[16, 32], [16, 64]]\n")
    with pytest.raises(ParamsError) as e:
        injection.prepare(bad, notebooks)
    assert ("notebooks.09_measured_vs_modeled: the cells left to fit, [(1, 32), (1, 64)], must be three or more at "
            "two batch sizes") in problems(e)
    bad.write_text("notebooks:\n  09_measured_vs_modeled:\n    timing_batches: [1, 16]\n    held_out: [[16, 64]]\n")
    assert injection.prepare(bad, notebooks)[2]["09_measured_vs_modeled"]["held_out"] == [[16, 64]]


def test_09_refuses_what_its_decoding_cannot_time_before_any_compute(tmp_path):
    """09 fits the profiled model to each round's draft, verify and bookkeeping: rounds replayed as
    one CUDA graph each (compiled decoding on a GPU) are timed whole, so that is refused by `plan`,
    as is an unknown interleaving; compiled decoding on the CPU (no graphs) is not."""
    notebooks = ROOT / "notebooks"
    bad = tmp_path / "bad.yaml"
    bad.write_text("series:\n  compile_decoding: true\n  device: cuda\n")
    with pytest.raises(ParamsError) as e:
        injection.prepare(bad, notebooks)
    assert ("notebooks.09_measured_vs_modeled: 09 fits the profiled model to each round's draft, verify and "
            "bookkeeping, and a round replayed as one CUDA graph is timed whole") in problems(e)
    bad.write_text("series:\n  compile_decoding: true\n  device: cpu\n")
    injection.prepare(bad, notebooks)  # no error
    bad.write_text("notebooks:\n  09_measured_vs_modeled:\n    interleave: round\n")
    with pytest.raises(ParamsError) as e:
        injection.prepare(bad, notebooks)
    assert "notebooks.09_measured_vs_modeled: interleave is 'rounds' or 'runs', not 'round'" in problems(e)


def test_fixture_notebooks_declare_typed_parameters():
    assert injection.declared_parameters(SERIES / "01_record.ipynb") == {
        "n": "int", "scale": "float", "label": "str", "device": "str"}


# ---------------------------------------------------------------------------- selection

def test_only_selects_by_number_or_stem_in_series_order():
    series = injection.discover(SERIES)
    assert [p.stem for p in series] == ["01_record", "02_consume", "03_fail", "04_after_failure"]
    assert [p.stem for p in injection.select(series, "03,01_record")] == ["01_record", "03_fail"]
    with pytest.raises(ParamsError, match="--only 05: no such notebook"):
        injection.select(series, "01,05")


def test_parameters_cells_read_without_papermill_as_papermill_reads_them():
    import papermill

    for nb in injection.discover(ROOT / "notebooks"):
        ours = injection.parameters_cell(nb)
        theirs = papermill.inspect_notebook(str(nb))
        assert {k: (v["inferred_type_name"], v["default"]) for k, v in ours.items()} == \
               {k: (v["inferred_type_name"], v["default"]) for k, v in theirs.items()}, nb.name
