"""``pytest --leafwatch``: real inner test files run by pytest's own ``pytester``.

The inner runs are in-process (torch is imported once), through the ``pytest11`` entry point that
``pip install -e .`` registers; the run that checks torch is not imported is a subprocess.
"""

from __future__ import annotations

import importlib.metadata

import pytest
import torch._dynamo  # noqa: F401
from _requirements import require_pytest_plugin

import leafwatch.integrations.runner  # noqa: F401

# The in-process runs restore sys.modules afterwards: what they import for the first time is
# dropped, and torch refuses to import some of its modules twice. Imported here, before them.

pytest_plugins = ["pytester"]

MODELS = '''
import torch
from torch import nn


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.encoder = nn.Linear(4, 8)
        self.head = nn.Linear(8, 1)
        self.aux_head = nn.Linear(8, 1)  # never used in the loss

    def forward(self, x):
        return self.head(torch.relu(self.encoder(x)))


class Clean(nn.Module):
    def __init__(self):
        super().__init__()
        self.encoder = nn.Linear(4, 8)
        self.head = nn.Linear(8, 1)

    def forward(self, x):
        return self.head(torch.relu(self.encoder(x)))


def train(model, steps=2):
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(16, 4), torch.randn(16, 1)
    for _ in range(steps):
        opt.zero_grad()
        ((model(x) - y) ** 2).mean().backward()
        opt.step()
    return model
'''


@pytest.fixture(autouse=True)
def _plugin_registered() -> None:
    """Every test here runs ``pytest --leafwatch``: without the entry point (leafwatch not
    installed) they skip locally and fail in CI."""
    require_pytest_plugin()


@pytest.fixture
def inner(pytester: pytest.Pytester) -> pytest.Pytester:
    pytester.makepyfile(models=MODELS)
    pytester.syspathinsert()
    return pytester


def test_the_plugin_is_registered_through_the_pytest11_entry_point():
    # As pytest reads them: every installed distribution's entry points (a stale leafwatch.egg-info
    # in the source tree may shadow the installed metadata for entry_points(group=...)).
    values = {ep.value for dist in importlib.metadata.distributions()
              for ep in dist.entry_points if ep.group == "pytest11" and ep.name == "leafwatch"}
    assert values == {"leafwatch.integrations.pytest_plugin"}, \
        "reinstall leafwatch (pip install -e .) to register its pytest plugin"


def test_a_test_whose_training_leaves_a_layer_untrained_fails_naming_it(inner):
    inner.makepyfile(test_inner='''
from models import Net, train

def test_trains():
    train(Net())
''')
    result = inner.runpytest("--leafwatch")
    result.assert_outcomes(failed=1)
    out = result.stdout.str()
    assert "leafwatch: the training in this test left 1 error finding(s) open after 2 optimizer steps" in out
    result.stdout.fnmatch_lines([
        "*missing_grad `aux_head` (2 tensors: aux_head.{bias,weight}): each of `aux_head.{bias,weight}` requires grad but got no gradient*",
        "*fix (advice): call `aux_head` in forward()*",
        "*- leafwatch -*",
        "leafwatch: the test's training, 2 optimizer steps",
        "*ERROR   missing_grad        aux_head (since*",
        "*cause: module `aux_head` never ran in this step's forward*",
        "*leafwatch: 1 test stepped an optimizer; 1 left an error finding open: test_inner.py::test_trains*",
    ])


def test_a_clean_training_test_passes_and_its_section_says_no_findings(inner):
    inner.makepyfile(test_inner='''
from models import Clean, train

def test_trains():
    train(Clean())
''')
    result = inner.runpytest("--leafwatch", "-rP")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["*- leafwatch -*", "leafwatch: the test's training, 2 optimizer steps",
                                 "leafwatch: no findings at step 2",
                                 "*leafwatch: 1 test stepped an optimizer; 0 left an error finding open.*"])


def test_a_test_that_steps_no_optimizer_is_untouched(inner):
    inner.makepyfile(test_inner='''
import torch
from models import Net

def test_inference_only():
    with torch.no_grad():
        assert Net()(torch.ones(2, 4)).shape == (2, 1)

def test_backward_without_a_step():
    Net()(torch.ones(2, 4)).sum().backward()

def test_no_torch_at_all():
    assert 1 + 1 == 2
''')
    result = inner.runpytest("--leafwatch", "-rA")
    result.assert_outcomes(passed=3)
    out = result.stdout.str()
    assert "- leafwatch -" not in out
    assert "missing_grad" not in out
    assert "leafwatch: no test stepped an optimizer, nothing was checked." in out


def test_a_failing_test_keeps_its_own_failure_and_gets_the_findings_section(inner):
    inner.makepyfile(test_inner='''
from models import Net, train

def test_trains_then_fails():
    train(Net())
    assert False, "the test's own assertion"
''')
    result = inner.runpytest("--leafwatch")
    result.assert_outcomes(failed=1)
    out = result.stdout.str()
    assert "the test's own assertion" in out
    assert "left 1 error finding(s) open" not in out  # the test's own failure is the one reported
    result.stdout.fnmatch_lines(["*- leafwatch -*", "*ERROR   missing_grad        aux_head (since*"])


def test_a_one_step_test_is_judged_at_its_end_from_the_structure(inner):
    # `leafwatch run` makes its first gradient check at an optimizer's second step; a test that
    # ends before is still decided when it ends, from what the structure says.
    inner.makepyfile(test_inner='''
import torch
from torch import nn
from models import Clean

def test_one_step():
    model = Clean()
    model.loss_weight = nn.Parameter(torch.ones(1))
    opt = torch.optim.SGD([p for n, p in model.named_parameters() if n != "loss_weight"], lr=0.1)
    (model.loss_weight * model(torch.randn(4, 4)).sum()).backward()
    opt.step()
''')
    result = inner.runpytest("--leafwatch")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*left 1 error finding(s) open after 1 optimizer step:*",
                                 "*not_in_optimizer `loss_weight`*"])


def test_a_one_step_test_with_an_unused_layer_fails_naming_it(inner):
    inner.makepyfile(test_inner='''
from models import Net, train

def test_one_step():
    train(Net(), steps=1)
''')
    result = inner.runpytest("--leafwatch")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([
        "*left 1 error finding(s) open after 1 optimizer step:*",
        "*missing_grad `aux_head` (2 tensors: aux_head.{bias,weight})*",
        "*cause: module `aux_head` never ran in this step's forward (the root module ran, but did not call it).*",
    ])


def test_one_step_of_each_optimizer_of_a_gan_gives_no_false_alarm(inner):
    inner.makepyfile(test_inner='''
import torch
from torch import nn

def test_gan_one_step_each():
    generator, critic = nn.Linear(2, 4), nn.Linear(4, 1)
    opt_g = torch.optim.Adam(generator.parameters(), lr=1e-3)
    opt_c = torch.optim.Adam(critic.parameters(), lr=1e-3)
    fake = generator(torch.randn(8, 2))
    opt_c.zero_grad()
    (critic(fake.detach()).mean() - critic(torch.randn(8, 4)).mean()).backward()
    opt_c.step()
    opt_g.zero_grad()
    (-critic(fake).mean()).backward()
    opt_g.step()

def test_clean_one_step():
    from models import Clean, train
    train(Clean(), steps=1)
''')
    result = inner.runpytest("--leafwatch", "-rP")
    result.assert_outcomes(passed=2)
    out = result.stdout.str()
    assert out.count("leafwatch: no findings at step 2") == 1  # the GAN: 2 steps, one per optimizer
    assert out.count("leafwatch: no findings at step 1") == 1
    assert "not_in_optimizer" not in out and "missing_grad" not in out


def test_training_in_a_fixture_counts_for_the_test_that_uses_it(inner):
    inner.makepyfile(test_inner='''
import pytest
from models import Net, train

@pytest.fixture
def trained():
    return train(Net())

def test_uses_a_trained_model(trained):
    assert trained is not None
''')
    result = inner.runpytest("--leafwatch")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*missing_grad `aux_head` (2 tensors: aux_head.{bias,weight})*"])


def test_leafwatch_ignore_marks_the_findings_ignored_and_the_test_passes(inner):
    inner.makepyfile(test_inner='''
from models import Net, train

def test_trains():
    train(Net())
''')
    result = inner.runpytest("--leafwatch", "--leafwatch-ignore", "aux_head.*=auxiliary head, trained later", "-rP")
    result.assert_outcomes(passed=1)
    out = result.stdout.str()
    assert "IGNORED missing_grad        aux_head (since step 1)" in out
    assert "ignored: auxiliary head, trained later (pattern 'aux_head.*')" in out
    assert "ignoring aux_head.*" in out  # the header


def test_a_pattern_that_matches_only_part_still_fails_on_the_rest(inner):
    inner.makepyfile(test_inner='''
from models import Net, train

def test_trains():
    train(Net())
''')
    result = inner.runpytest("--leafwatch", "--leafwatch-ignore", "aux_head.bias")
    result.assert_outcomes(failed=1)
    out = result.stdout.str()
    # The mistake stays open on the rest: its table line says which tensor the pattern took out.
    assert "missing_grad `aux_head` (2 tensors: aux_head.{bias,weight})" in out
    assert "1 of them ignored (aux_head.bias)" in out


def test_an_empty_ignore_pattern_is_a_usage_error(inner):
    result = inner.runpytest("--leafwatch", "--leafwatch-ignore", "=why")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert "`--leafwatch-ignore` takes PATTERN[=REASON] with a non-empty pattern, got '=why'" in result.stderr.str()


def test_the_markers_opt_a_test_out_or_ignore_names_in_it(inner):
    inner.makepyfile(test_inner='''
import pytest
from models import Net, train

@pytest.mark.leafwatch_skip(reason="trains a deliberately broken model")
def test_skipped():
    train(Net())

@pytest.mark.leafwatch(ignore={"aux_head.*": "auxiliary head, trained later"})
def test_ignored():
    train(Net())

@pytest.mark.leafwatch(ignore=["encoder.*"])
def test_ignored_elsewhere():
    train(Net())
''')
    result = inner.runpytest("--leafwatch", "-rA")
    result.assert_outcomes(passed=2, failed=1)
    out = result.stdout.str()
    assert "FAILED test_inner.py::test_ignored_elsewhere" in out
    assert "IGNORED missing_grad        aux_head (since step 1)" in out
    assert "ignored: auxiliary head, trained later (pattern 'aux_head.*')" in out
    assert "leafwatch: 2 tests stepped an optimizer; 1 left an error finding open" in out


def test_a_marker_with_bad_options_errors_the_test_naming_them(inner):
    inner.makepyfile(test_inner='''
import pytest
from models import Net, train

@pytest.mark.leafwatch(ignor=["aux_head.*"])
def test_typo():
    train(Net())

@pytest.mark.leafwatch(patience=0)
def test_bad_patience():
    train(Net())
''')
    result = inner.runpytest("--leafwatch")
    result.assert_outcomes(errors=2)
    result.stdout.fnmatch_lines(["*TypeError: @pytest.mark.leafwatch can take `ignore` and `patience`, got ignor*",
                                 "*ValueError: `patience` must be >= 1, got 0*"])


def test_without_the_option_nothing_is_audited(inner):
    inner.makepyfile(test_inner='''
from models import Net, train

def test_trains():
    train(Net())
''')
    result = inner.runpytest("-rA")
    result.assert_outcomes(passed=1)
    out = result.stdout.str()
    assert "leafwatch:" not in out and "- leafwatch -" not in out


def test_without_the_option_the_plugin_does_not_import_torch(pytester: pytest.Pytester):
    pytester.makepyfile(test_inner='''
import sys

def test_torch_not_imported():
    assert "torch" not in sys.modules
''')
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=1)
    assert "leafwatch-0.1.0" in result.stdout.str()  # the header's plugin list: it was loaded
    help_text = pytester.runpytest_subprocess("--help").stdout.str()
    assert "--leafwatch-ignore=PATTERN[=REASON]" in help_text
