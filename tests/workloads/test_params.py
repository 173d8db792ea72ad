"""The schemes' hyper-parameter declarations (workloads.schemes.params) and what is derived
from them: the train flags, their checks, SchemeOptions, the summary's hyper, variants.

The expected hyper dicts, summary keys and variant results below were computed with the
code before the declarations existed (flags, checks and registry entries written out by
hand), and must not change: recorded summaries and report's grouping depend on them."""

import dataclasses
import subprocess
import sys

import pytest

from tests.workloads.launch import ROOT
from workloads import pruning, schemes
from workloads.schemes import SchemeOptions, parameter, parameters, parse_variant
from workloads.schemes.params import PARAMETERS, Choice, ImportPath, Param, Range
from workloads.train import check, hyper_params, parse_args

TRAIN = {"model": "cnn", "dataset": "digits", "width": 1.0, "depth": None, "batch_size": 32, "lr": 0.05,
         "momentum": 0.9, "weight_decay": 0.0005, "lr_schedule": "const", "epochs": 3, "max_iters": None,
         "bucket_cap_mb": 25.0}
"""The train part of hyper under the default flags."""

PACTRAIN = {"prune_ratio": 0.5, "prune_method": "magnitude", "ternary": True, "stable_iters": 3, "terngrad_clip": 2.5}
"""pactrain's part of hyper by default: the paper's PacTrain, ternary on."""


@pytest.mark.parametrize("argv, train, scheme, init", [
    (["--scheme", "allreduce"], {}, {}, None),
    (["--scheme", "fp16", "--topk-ratio", "0.2"], {}, {}, None),
    (["--scheme", "topk:0.1"], {}, {"topk_ratio": 0.1}, None),
    (["--scheme", "topk", "--topk-ratio", "0.05", "--lr", "0.1", "--max-iters", "7"],
     {"lr": 0.1, "max_iters": 7}, {"topk_ratio": 0.05}, None),
    (["--scheme", "powersgd:8:start_iter=20"], {}, {"powersgd_rank": 8, "powersgd_start_iter": 20}, None),
    (["--scheme", "terngrad:clip=0"], {}, {"terngrad_clip": 0.0}, None),
    (["--scheme", "pactrain"], {}, PACTRAIN, None),
    (["--scheme", "pactrain:0.8:ternary"], {},
     {"prune_ratio": 0.8, "prune_method": "magnitude", "ternary": True, "stable_iters": 3, "terngrad_clip": 2.5}, None),
    (["--scheme", "pactrain:grasp:stable_iters=5:0.3:exact", "--grasp-batches", "4"], {},
     {"prune_ratio": 0.3, "prune_method": "grasp", "ternary": False, "stable_iters": 5}, None),
    (["--scheme", "pactrain", "--ternary", "--terngrad-clip", "1.5", "--init", "/x/ck.pt"], {},
     {**PACTRAIN, "terngrad_clip": 1.5}, "ck.pt"),
    (["--scheme", "pactrain", "--no-ternary"], {},
     {"prune_ratio": 0.5, "prune_method": "magnitude", "ternary": False, "stable_iters": 3}, None),
    (["--scheme", "spardl:0.05:teams=switch"], {}, {"spardl_density": 0.05, "spardl_teams": "switch", "spardl_d": 0,
                                                        "spardl_h": "adaptive"}, None),
    (["--scheme", "prunex:0.7:rho=0.2:admm_every=5:prune_at=0.5", "--model", "resnet18", "--depth", "2"],
     {"model": "resnet18", "depth": 2},
     {"prunex_sparsity": 0.7, "prunex_rho": 0.2, "prunex_admm_every": 5, "prunex_prune_at": 0.5}, None),
    (["--scheme", "hier-allreduce", "--width", "0.5", "--lr-schedule", "cosine"],
     {"width": 0.5, "lr_schedule": "cosine"}, {}, None),
])
def test_hyper_is_what_it_was_before_the_declarations(argv, train, scheme, init):
    args = parse_args(argv, raise_errors=True)
    got = hyper_params(args, schemes.get(args.scheme), "digits")
    want = {**TRAIN, **train, **scheme, "init": init, "pretrain_dataset": "digits"}
    assert list(got.items()) == list(want.items()), "same keys, values and order (summary.json's bytes)"


@pytest.mark.parametrize("name", schemes.names())
def test_each_schemes_hyper_is_its_recorded_declarations(name):
    args = parse_args(["--scheme", name, "--ternary"], raise_errors=True)
    recorded = [p.name for p in parameters(name) if p.recorded]
    assert list(schemes.hyper(name, vars(args))) == recorded == list(schemes.get(name).params)
    assert all(name in p.schemes for p in parameters(name))


def test_a_parameter_that_needs_a_switch_is_recorded_only_with_it():
    off = vars(parse_args(["--scheme", "pactrain:exact"], raise_errors=True))
    assert "terngrad_clip" not in schemes.hyper("pactrain", off), "clip changes nothing without ternary"
    assert schemes.hyper("terngrad", off) == {"terngrad_clip": 2.5}, "terngrad has no switch: always recorded"


@pytest.mark.parametrize("argv, want", [
    (["--scheme", "allreduce"], {"prune_ratio": None, "ternary": None, "topk_ratio": None, "spardl_density": None,
                                 "prunex_sparsity": None, "hook": None}),
    (["--scheme", "pactrain:0.3:ternary"], {"prune_ratio": 0.3, "ternary": True, "topk_ratio": None,
                                            "spardl_density": None, "prunex_sparsity": None, "hook": None}),
    (["--scheme", "topk:0.1"], {"prune_ratio": None, "ternary": None, "topk_ratio": 0.1, "spardl_density": None,
                                "prunex_sparsity": None, "hook": None}),
    (["--scheme", "spardl"], {"prune_ratio": None, "ternary": None, "topk_ratio": None, "spardl_density": 0.01,
                              "prunex_sparsity": None, "hook": None}),
    (["--scheme", "prunex:0.7"], {"prune_ratio": None, "ternary": None, "topk_ratio": None, "spardl_density": None,
                                  "prunex_sparsity": 0.7, "hook": None}),
])
def test_the_summarys_top_level_parameter_keys_are_what_they_were(argv, want):
    args = parse_args(argv, raise_errors=True)
    assert list(schemes.summary_values(args.scheme, vars(args)).items()) == list(want.items())


@pytest.mark.parametrize("param", parameters(), ids=lambda p: p.name)
def test_every_declared_parameter_is_a_train_flag_with_its_default(param):
    args = parse_args([], raise_errors=True)
    assert getattr(args, param.name) == param.default and type(getattr(args, param.name)) is param.type
    if param.type is bool:
        assert getattr(parse_args([param.flag], raise_errors=True), param.name) is True
        assert getattr(parse_args([param.no_flag], raise_errors=True), param.name) is False
    else:
        assert getattr(parse_args([param.flag, str(param.default)], raise_errors=True), param.name) == param.default


def test_the_flags_keep_their_names_and_defaults():
    assert {p.flag: p.default for p in parameters()} == {
        "--prune-ratio": 0.5, "--prune-method": "magnitude", "--grasp-batches": 2, "--ternary": True,
        "--stable-iters": 3, "--topk-ratio": 0.01, "--terngrad-clip": 2.5, "--powersgd-rank": 4,
        "--powersgd-start-iter": 10, "--spardl-density": 0.01, "--spardl-teams": "auto", "--spardl-d": 0,
        "--spardl-h": "adaptive", "--prunex-sparsity": 0.5,
        "--prunex-rho": 0.1, "--prunex-admm-every": 0, "--prunex-prune-at": 0.3, "--hook": "", "--hook-path": ""}


def _invalid(param: Param):
    c = param.check
    if isinstance(c, Choice):
        return "nope"
    if isinstance(c, ImportPath):
        return "not/a:path"
    if c.low is not None:
        return c.low if c.low_open else c.low - 1
    return c.high if c.high_open else c.high + 1


@pytest.mark.parametrize("param", [p for p in parameters() if p.check is not None], ids=lambda p: p.name)
def test_an_invalid_value_is_refused_naming_the_flag_and_the_valid_values(param):
    bad = _invalid(param)
    with pytest.raises(ValueError) as e:
        check(["--scheme", param.schemes[0], f"{param.flag}={bad}", "--max-iters", "1"])
    assert str(e.value) == f"{param.flag} must be {param.check}, got {param.type(bad)!r}"
    with pytest.raises(ValueError, match=param.flag):  # a scheme's own options are checked alike
        SchemeOptions(**{param.name: param.type(bad)})


def test_checks_say_the_valid_values_as_the_messages_always_did():
    assert str(parameter("prune_ratio").check) == "in [0, 1)"
    assert str(parameter("topk_ratio").check) == "in (0, 1]"
    assert str(parameter("prunex_admm_every").check) == ">= 0"
    assert str(parameter("spardl_teams").check) == "1, switch or auto"
    assert not Range(0).accepts(float("nan")) and not Range(0).accepts(float("inf")) and not Range(0).accepts(True)
    with pytest.raises(ValueError, match="--spardl-teams must be 1, switch or auto, got '3'"):
        parameter("spardl_teams").validate("3")


def test_a_declaration_that_contradicts_itself_is_refused():
    with pytest.raises(ValueError, match="must be in"):
        Param("x", float, 2.0, "", ("topk",), Range(0, 1))
    with pytest.raises(ValueError, match="switch"):
        Param("x", bool, 1, "", ("topk",))
    with pytest.raises(ValueError, match="only a switch"):
        Param("x", str, "a", "", ("topk",), off_words=("b",))
    with pytest.raises(ValueError, match="words"):
        Param("x", str, "a", "", ("topk",), Choice(("a",)), words=("b",))


def test_scheme_options_are_the_declarations_plus_the_context():
    fields = {f.name: f.default for f in dataclasses.fields(SchemeOptions)}
    context = ["process_group", "device", "seed", "placement", "total_iters"]
    assert list(fields) == context + [p.name for p in parameters()]
    assert all(fields[p.name] == p.default for p in parameters())
    args = parse_args(["--scheme", "spardl:0.05:teams=1"], raise_errors=True)
    opts = schemes.options(vars(args), device="cpu", seed=3, total_iters=9)
    assert (opts.spardl_density, opts.spardl_teams, opts.seed, opts.total_iters) == (0.05, "1", 3, 9)


def test_the_registry_api():
    assert schemes.names() == tuple(schemes.SCHEMES)
    assert [p.name for p in parameters("powersgd")] == ["powersgd_rank", "powersgd_start_iter"]
    assert parameters() == PARAMETERS and parameter("ternary").flag == "--ternary"
    with pytest.raises(ValueError, match="unknown scheme hyper-parameter 'k'; choose one of: prune_ratio"):
        parameter("k")
    with pytest.raises(ValueError, match="unknown scheme 'nope'"):
        parameters("nope")
    assert parameter("prune_method").check.values == pruning.METHODS, "the choices are the implemented methods"


def test_the_declarations_import_no_torch():
    """Launchers (testbed run) read them to build their own flags: that must stay cheap."""
    code = "import sys, workloads.schemes as s; s.parameters(); s.parse_variant('topk:0.1'); print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


@pytest.mark.parametrize("spec, name, values", [
    ("topk", "topk", {}),
    ("topk:0.1", "topk", {"topk_ratio": "0.1"}),
    ("topk:ratio=0.2", "topk", {"topk_ratio": "0.2"}),
    ("topk:topk_ratio=0.3", "topk", {"topk_ratio": "0.3"}),
    ("topk:topk-ratio=0.3", "topk", {"topk_ratio": "0.3"}),
    ("powersgd:8", "powersgd", {"powersgd_rank": "8"}),
    ("powersgd:8:start_iter=20", "powersgd", {"powersgd_rank": "8", "powersgd_start_iter": "20"}),
    ("powersgd:start_iter=20:8", "powersgd", {"powersgd_start_iter": "20", "powersgd_rank": "8"}),
    ("terngrad:0", "terngrad", {"terngrad_clip": "0"}),
    ("terngrad:clip=1.5", "terngrad", {"terngrad_clip": "1.5"}),
    ("pactrain:0.8:ternary", "pactrain", {"prune_ratio": "0.8", "ternary": "true"}),
    ("pactrain:ternary", "pactrain", {"ternary": "true"}),
    ("pactrain:grasp", "pactrain", {"prune_method": "grasp"}),
    ("pactrain:0.5:grasp:stable_iters=5", "pactrain", {"prune_ratio": "0.5", "prune_method": "grasp",
                                                       "stable_iters": "5"}),
    ("pactrain:magnitude:0.3:ternary:terngrad_clip=1", "pactrain",
     {"prune_method": "magnitude", "prune_ratio": "0.3", "ternary": "true", "terngrad_clip": "1"}),
    ("pactrain:ternary=true", "pactrain", {"ternary": "true"}),
    ("pactrain:exact", "pactrain", {"ternary": "false"}),
    ("pactrain:0.3:exact", "pactrain", {"prune_ratio": "0.3", "ternary": "false"}),
    ("pactrain:ternary=off", "pactrain", {"ternary": "off"}),
    ("spardl:0.05", "spardl", {"spardl_density": "0.05"}),
    ("spardl:0.05:teams=switch", "spardl", {"spardl_density": "0.05", "spardl_teams": "switch"}),
    ("spardl:teams=1", "spardl", {"spardl_teams": "1"}),
    ("spardl:switch", "spardl", {"spardl_density": "switch"}),  # not a word: the train parser refuses it
    ("prunex:0.7:rho=0.2:admm_every=5:prune_at=0.5", "prunex",
     {"prunex_sparsity": "0.7", "prunex_rho": "0.2", "prunex_admm_every": "5", "prunex_prune_at": "0.5"}),
    ("hier-allreduce", "hier-allreduce", {}),
    ("fp16", "fp16", {}),
    ("allreduce", "allreduce", {}),
    ("pactrain:grasp_batches=4", None, "scheme variant 'pactrain:grasp_batches=4': pactrain has no parameter "
     "'grasp_batches'; its parameters: prune_ratio, prune_method, ternary, stable_iters, terngrad_clip"),
    ("pactrain:0.5:0.6", None, r"unexpected '0.6' \(pactrain takes 1 bare value\(s\); words: "),
    ("fp16:1", None, r"scheme variant 'fp16:1': unexpected '1' \(fp16 takes 0 bare value\(s\)\); a scheme, or "),
    ("prunex:sparsity=", None, "scheme variant 'prunex:sparsity=': prunex_sparsity has no value"),
    ("topk:0.1:ratio=0.2", None, "scheme variant 'topk:0.1:ratio=0.2': topk_ratio is set twice"),
    ("nope", None, "unknown scheme 'nope'; choose one of: allreduce, fp16, topk, powersgd, terngrad, pactrain, "
     "spardl, gtopk, prunex, hier-allreduce"),
    ("", None, "the scheme is empty; a scheme, or a variant"),
])
def test_variant_specs_parse_as_before(spec, name, values):
    if name is None:
        with pytest.raises(ValueError, match=values):
            parse_variant(spec)
        return
    scheme, got = parse_variant(spec)
    assert scheme.name == name and list(got.items()) == list(values.items())


def test_a_switch_in_a_variant_is_a_word_or_on_or_off():
    assert parse_args(["--scheme", "pactrain:ternary=false"], raise_errors=True).ternary is False
    assert parse_args(["--scheme", "pactrain:ternary"], raise_errors=True).ternary is True
    assert parse_args(["--scheme", "pactrain:exact"], raise_errors=True).ternary is False
    assert parse_args(["--scheme", "pactrain", "--no-ternary"], raise_errors=True).ternary is False
    with pytest.raises(ValueError, match=r"ternary=maybe is not a switch's value; write pactrain:ternary or "
                                         r"pactrain:exact"):
        parse_args(["--scheme", "pactrain:ternary=maybe"], raise_errors=True)
    with pytest.raises(ValueError, match=r"--ternary is given twice"):
        parse_args(["--scheme", "pactrain:exact", "--no-ternary"], raise_errors=True)


@pytest.mark.parametrize("flag, value, words", [
    ("--epochs", "nan", "--epochs must be a number > 0, got nan"),
    ("--epochs", "0", "--epochs must be a number > 0"),
    ("--max-iters", "0", "--max-iters must be an integer >= 1, got 0"),
    ("--max-iters", "-1", "--max-iters must be an integer >= 1"),
    ("--lr", "inf", "--lr must be a number >= 0, got inf"),
    ("--width", "1e308", "--width must be a number in (0, 64]"),
    ("--eval-every", "-5", "--eval-every must be an integer >= 0"),
    ("--momentum", "1.5", "--momentum must be in [0, 1)"),
])
def test_nonsense_training_values_are_refused_by_name_before_any_rank_runs(flag, value, words):
    """`--max-iters 0` trained all epochs and `--epochs nan` died inside a rank as 'cannot
    convert float NaN to integer'; testbed run calls this same check before launching."""
    with pytest.raises(ValueError, match=words.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")):
        check([flag, value])
