"""The paper's results: a table apart from the architecture, keyed by registered name."""

import dataclasses

import pytest

import keras_preact
from keras_preact import cli
from keras_preact.paper import PAPER_RESULTS, paper_result

# Table 3 of the paper (CIFAR-10, original -> pre-activation), as /work/shared/PAPER.md has it.
TABLE_3 = [
    ("resnet-110-single", "9.90", "preact-110-single", "8.91"),
    ("resnet-110", "6.61", "preact-110", "6.37"),
    ("resnet-164", "5.93", "preact-164", "5.46"),
    ("resnet-1001", "7.61", "preact-1001", "4.92"),
]


def test_every_figure_is_of_a_registered_network_and_is_what_list_prints(capsys):
    assert set(PAPER_RESULTS) <= set(keras_preact.list_models())
    assert cli.main(["list", "--markdown"]) == 0
    rows = [line.strip("| ").split(" | ") for line in capsys.readouterr().out.splitlines()[2:]]
    printed = {row[0]: row[-1] for row in rows}
    assert set(printed) == set(keras_preact.list_models())
    assert printed == {name: PAPER_RESULTS.get(name, "-") for name in printed}
    assert sum(figure != "-" for figure in printed.values()) == len(PAPER_RESULTS) == 28


@pytest.mark.parametrize("original, error, preact, preact_error", TABLE_3)
def test_table_3_figures(original, error, preact, preact_error):
    assert PAPER_RESULTS[original].split()[0].rstrip(";") == error
    assert PAPER_RESULTS[preact].split()[0].rstrip(";") == preact_error


def test_the_architecture_spec_holds_no_result():
    assert "paper_result" not in {f.name for f in dataclasses.fields(keras_preact.ResNetSpec)}
    with pytest.raises(ValueError, match=r"Unknown override\(s\) \['paper_result'\]"):
        keras_preact.resolve("preact-110", paper_result="6.37")


@pytest.mark.parametrize("overrides", [
    {"classes": 100}, {"depth": 56}, {"shortcut": "dropout"}, {"unit": "full-preact"},
    {"input_shape": (64, 64, 3)}, {"gate_bias": -6.0},
])
def test_an_override_that_changes_the_network_drops_the_figure(overrides):
    assert paper_result("resnet-110") == "6.61 (Table 1-3)"
    assert paper_result("resnet-110", **overrides) == ""


@pytest.mark.parametrize("overrides", [
    {"include_top": False, "pooling": "avg"}, {"classifier_activation": None},
    {"depth": 110}, {"classes": 10},  # the registered values
])
def test_head_overrides_keep_the_figure(overrides):
    assert paper_result("resnet-110", **overrides) == "6.61 (Table 1-3)"


def test_networks_the_paper_does_not_report_and_unknown_names():
    assert paper_result("preact-20") == "" and paper_result("preact-50-imagenet") == ""
    with pytest.raises(ValueError, match="Unknown model name 'preact-111'"):
        paper_result("preact-111")
    with pytest.raises(ValueError, match="Unknown override"):
        paper_result("preact-110", paper="6.37")
