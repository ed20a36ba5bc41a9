"""Libraries nobody here wrote, used as their own docs and examples use them, under leafwatch.

Each pattern is rebuilt the way the library writes it, with the library itself (skipped locally,
failed in CI, when it is not installed: ``tests/_requirements.py``), in a real training loop under a
``Monitor`` and under ``leafwatch run``:

- vector-quantize-pytorch starts each quantizer's loss from a registered buffer that its own forward
  switches on (``loss = self.zero; loss.requires_grad_()``): the loss's constant, no tensor meant to
  train, so no finding; the user's own buffer registered with ``requires_grad=True`` still is one.
- torchdiffeq's ``odeint_adjoint`` differentiates only the parameters of the module it integrates: a network
  used inside it but not registered there is named as run inside ``OdeintAdjointMethod``'s forward.
- Pyro's ``PyroOptim`` builds its torch optimizers inside ``svi.step``: a module registered with
  ``pyro.module`` outside the model is fixed by calling it inside the model, never by ``add_param_group``.
- kornia's ``RandomResizedCrop`` turns learnable ranges into integer crop boxes: integer indexing cuts the
  gradient, and the fix is a differentiable resampling, not another op at that line.
- higher's MAML (``innerloop_ctx``) runs a patched copy of the network on fast weights that higher keeps in a
  plain list (``_fast_params``): no orphan, and no walk through the user's own ``monitor`` variable;
  ``copy_initial_weights=True`` (higher's default) starts them from detached copies, named as such with the fix
  ``copy_initial_weights=False``.
- Opacus's ``make_private`` returns a ``DPOptimizer`` that never runs ``Optimizer.__init__`` (torch's step hooks
  fire for the SGD it holds as ``.original_optimizer``) and a ``GradSampleModule`` that names every parameter
  ``_module.<name>``: an attached Monitor checks every step, under the user's names.
"""

from __future__ import annotations

import os
import runpy
import subprocess
import sys
import warnings
from pathlib import Path

import _warm
import pytest
import torch
from _requirements import require_module

import leafwatch

REPO = Path(__file__).resolve().parents[2]
SCRIPTS = REPO / "tests" / "scripts" / "third_party"


def _leafwatch_run(script: str, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    result = _warm.run([sys.executable, "-m", "leafwatch", "run", str(SCRIPTS / script), *args],
                       capture_output=True, text=True, env=env, cwd=REPO, timeout=300)
    assert result.returncode == 0, result.stderr
    assert "LeafwatchInternalWarning" not in result.stderr, result.stderr
    assert result.stdout.endswith("done\n"), result.stdout
    return result


def _attached(script: str, *args: str) -> leafwatch.Report:
    """The script's training run in this process with a Monitor attached right after its model and
    optimizer are built, as a user adds one; what it found when the run ended."""
    train = runpy.run_path(str(SCRIPTS / script), run_name="third_party_script")["train"]
    monitor = train(list(args), attach=lambda model, opt: leafwatch.Monitor(model, opt, verbose=False).attach())
    return monitor.close()


# -- vector-quantize-pytorch: the loss accumulator buffer -------------------------------------------
def test_vector_quantize_pytorch_readme_config_trains_under_a_monitor_with_no_finding() -> None:
    require_module("vector_quantize_pytorch")
    report = _attached("vq_autoencoder.py")
    assert report.findings == [], report


def test_vector_quantize_pytorch_readme_config_trains_under_leafwatch_run_with_no_finding() -> None:
    require_module("vector_quantize_pytorch")
    result = _leafwatch_run("vq_autoencoder.py")
    assert "leafwatch: no findings at step" in result.stderr, result.stderr
    assert "zero" not in result.stderr


def _assert_scale_buffer_found(report_or_text) -> None:
    (f,) = report_or_text.findings
    assert (f.kind, f.name, f.severity) == ("not_in_optimizer", "scale", "error")
    assert f.reason.name == "buffer_requires_grad"
    assert "`scale` is a buffer registered with `requires_grad=True`" in f.cause
    assert "`nn.Parameter`" in f.fix


def test_a_users_buffer_registered_with_requires_grad_next_to_vector_quantize_is_still_found() -> None:
    require_module("vector_quantize_pytorch")
    _assert_scale_buffer_found(_attached("vq_autoencoder.py", "--scale-buffer"))


def test_a_users_buffer_registered_with_requires_grad_is_found_under_leafwatch_run() -> None:
    require_module("vector_quantize_pytorch")
    result = _leafwatch_run("vq_autoencoder.py", "--scale-buffer")
    assert "ERROR   not_in_optimizer    scale" in result.stderr, result.stderr
    assert "`scale` is a buffer registered with `requires_grad=True`" in result.stderr
    assert "zero" not in result.stderr


def test_a_users_buffer_switched_on_in_the_users_forward_is_found_with_that_line() -> None:
    require_module("vector_quantize_pytorch")
    (f,) = _attached("vq_autoencoder.py", "--switched-on").findings
    assert (f.kind, f.name, f.severity) == ("not_in_optimizer", "scale", "error")
    assert f.reason.name == "buffer_switched_on"
    assert f.cause == ("`scale` is a registered buffer that your forward switches to `requires_grad` (`requires_grad_()` "
                       "at vq_autoencoder.py:32 (in `VQAutoEncoder.forward`)): `parameters()` does not list buffers, "
                       "so the optimizer was built without it.")
    assert f.fix.endswith("and remove the `requires_grad_()` at vq_autoencoder.py:32")


# -- torchdiffeq: a network used inside odeint_adjoint's Function, not given to it -----------------
def test_a_network_not_registered_in_the_module_odeint_adjoint_integrates_is_named_inside_its_function() -> None:
    require_module("torchdiffeq")
    report = _attached("ode_adjoint.py")
    (f,) = report.findings
    assert (f.kind, f.severity) == ("missing_grad", "error")
    assert {m.name for m in f.members} == {"net.0.weight", "net.0.bias", "net.2.weight", "net.2.bias"}
    assert f.reason.name == "inside_function"
    assert f.cause.startswith("`net` ran only inside the forward of the custom autograd.Function "
                              "`OdeintAdjointMethod` (applied at adjoint.py:")
    assert ", reached from your call at ode_adjoint.py:48)" in f.cause
    assert "to the tensors given to `OdeintAdjointMethod.apply`" in f.cause
    assert f.fix.startswith("register `net` as a submodule of `ODEFunc`, the module you integrate")
    assert "`adjoint_params=`" in f.fix
    assert "weight` itself" not in f.fix and "grad mode" not in f.cause


def test_leafwatch_run_names_odeint_adjoints_function_as_the_cause() -> None:
    require_module("torchdiffeq")
    result = _leafwatch_run("ode_adjoint.py")
    assert "ERROR   missing_grad        net, inside `OdeintAdjointMethod` at ode_adjoint.py:48" in result.stderr, \
        result.stderr
    assert "each of `net.{0,2}.{bias,weight}` requires grad but got no gradient" in result.stderr
    assert "cause: `net` ran only inside the forward of the custom autograd.Function `OdeintAdjointMethod`" \
        in result.stderr
    assert "fix (advice): register `net` as a submodule of `ODEFunc`" in result.stderr


def test_a_network_registered_in_the_module_odeint_adjoint_integrates_is_no_finding() -> None:
    require_module("torchdiffeq")
    assert _attached("ode_adjoint.py", "--registered").findings == []
    assert "leafwatch: no findings at step" in _leafwatch_run("ode_adjoint.py", "--registered").stderr


# -- Pyro: a module registered with pyro.module outside the model ------------------------------------
# (no Monitor can be attached by hand: the user holds no torch optimizer, PyroOptim builds them in svi.step)
def test_pyro_module_called_outside_the_model_is_fixed_by_calling_it_inside_the_model() -> None:
    require_module("pyro")
    result = _leafwatch_run("pyro_vae.py")
    assert "ERROR   not_in_optimizer    decoder" in result.stderr, result.stderr
    assert "each of `decoder.{fc1,fc21}.{bias,weight}` requires grad but no optimizer that stepped" in result.stderr
    assert "cause: `vae.decoder` is in Pyro's param store (`pyro.module(\"decoder\", ...)`), but registered outside " \
        "the model and the guide" in result.stderr
    assert "the optimizers that step are built by `pyro` at pyro/optim/optim.py:" in result.stderr
    assert "inside your call at pyro_vae.py:79, and none of them is yours" in result.stderr
    assert "fix (advice): call `pyro.module(\"decoder\", ...)` on `vae.decoder` inside the model (the function " \
        "passed to SVI)" in result.stderr
    assert "add_param_group" not in result.stderr  # the user holds no optimizer to add it to


def test_pyro_svi_with_pyro_module_inside_the_model_is_no_finding() -> None:
    require_module("pyro")
    result = _leafwatch_run("pyro_vae.py", "--in-model")
    assert "leafwatch: no findings at step" in result.stderr, result.stderr


# -- kornia: learnable ranges that only pick integer crop boxes ---------------------------------------
def _require_kornia() -> None:
    if sys.version_info < (3, 11):  # (no requirement is missing there: the pin leaves kornia out)
        pytest.skip("kornia 0.9.0, the pinned version, needs Python >= 3.11: the test extra installs it only there")
    require_module("kornia")


def _assert_integer_cut(cause: str, fix: str) -> None:
    assert cause.startswith("cut by `torch.as_tensor(..., dtype=torch.int64)` at crop2d.py:"), cause
    assert "(in `crop_by_indices`), called from kornia_crop.py:23 (in `AugNet.forward`)" in cause
    assert "(rounded on the way: `floor()`, `round()`, whose gradient is zero)" in cause
    assert "become integers (`torch.int64`) there" in cause and "integer indexing cuts the gradient" in cause
    assert "carries no gradient in any form" in cause
    assert fix.startswith("no torch op carries a gradient through integers (it runs inside a library, reached from "
                          "your call at kornia_crop.py:23)")
    assert "differentiable resampling" in fix and "`torch.nn.functional.grid_sample`" in fix
    assert "use torch ops" not in fix and "not `torch.as_tensor" not in fix


def test_kornia_learnable_crop_ranges_are_cut_by_integer_indices() -> None:
    _require_kornia()
    report = _attached("kornia_crop.py")
    (f,) = report.findings
    assert (f.kind, f.severity, f.reason.name) == ("missing_grad", "error", "integer_cut")
    # Named by the module that holds its tensors, its place said as a location (#52 item 5: names are names).
    assert (f.name, f.details["location"]) == (
        "aug._param_generator", "cut by `torch.as_tensor(..., dtype=torch.int64)` at kornia_crop.py:23")
    assert {m.name for m in f.members} == {"aug._param_generator.scale", "aug._param_generator.ratio"}
    _assert_integer_cut(f.cause, f.fix)


def test_leafwatch_run_says_kornias_crop_ranges_become_integers() -> None:
    _require_kornia()
    result = _leafwatch_run("kornia_crop.py")
    assert ("ERROR   missing_grad        aug._param_generator, cut by `torch.as_tensor(..., dtype=torch.int64)` at "
            "kornia_crop.py:23") in result.stderr
    cause = result.stderr.split("cause: ")[1].split("\n")[0]
    fix = result.stderr.split("fix (advice): ")[1].split("\n")[0]
    _assert_integer_cut(cause, fix)


# -- Opacus: DPOptimizer and GradSampleModule ----------------------------------------------------------
def test_opacus_dp_optimizer_is_checked_at_every_step_under_an_attached_monitor() -> None:
    require_module("opacus")
    seen: list[leafwatch.Monitor] = []

    def attach(model, opt):
        seen.append(leafwatch.Monitor(model, opt, verbose=False).attach())
        return seen[0]

    train = runpy.run_path(str(SCRIPTS / "opacus_dp.py"), run_name="third_party_script")["train"]
    monitor = train([], attach=attach)
    assert monitor.step == 8  # one check per step of the 8 (none before: the DPOptimizer was not seen)
    (opt,) = monitor.optimizers
    assert type(opt) is torch.optim.SGD  # the one it steps, under `.original_optimizer`
    assert monitor.close().findings == []


def _assert_head_left_out(f) -> None:
    assert (f.kind, f.name, f.severity) == ("not_in_optimizer", "head", "error")
    assert {m.name for m in f.members} == {"head.weight", "head.bias"}  # no `_module.` prefix
    assert "_module" not in f.cause + f.fix
    assert f.cause == "each of `head.{bias,weight}` was left out when the optimizer's parameter list was built."


def test_opacus_left_out_head_is_named_by_the_users_module_name() -> None:
    require_module("opacus")
    (f,) = _attached("opacus_dp.py", "--left-out").findings
    _assert_head_left_out(f)


def test_leafwatch_run_names_opacus_left_out_head_without_the_wrapper_prefix() -> None:
    require_module("opacus")
    result = _leafwatch_run("opacus_dp.py", "--left-out")
    assert "leafwatch: summary after 8 optimizer steps" in result.stderr, result.stderr
    assert "ERROR   not_in_optimizer    head (since step 1" in result.stderr
    # make_private registers the model again inside its wrapper, after the optimizer: no "created after" cause
    assert "cause: each of `head.{bias,weight}` was left out when the optimizer's parameter list was built." \
        in result.stderr
    assert "_module" not in result.stderr and "was created at" not in result.stderr


def test_leafwatch_run_of_a_private_training_with_every_parameter_in_the_optimizer_is_no_finding() -> None:
    require_module("opacus")
    result = _leafwatch_run("opacus_dp.py")
    assert "leafwatch: summary after 8 optimizer steps\nleafwatch: no findings at step 8" in result.stderr, result.stderr


# -- higher: MAML's fast weights ---------------------------------------------------------------------
_COPIED_CAUSE = ("the root module never ran in this step: `higher`'s copy of it, `fnet` (a `FunctionalSequential`), "
                 "ran in its place, on weights that start as copies of its parameters' values (`copy_initial_weights="
                 "True`, higher's default for `higher.innerloop_ctx` and `higher.monkeypatch`, makes them new leaves). "
                 "Backward stops at those copies (they got the gradients), so no gradient reaches each of "
                 "`{0,2}.{bias,weight}`.")
_COPIED_FIX = ("pass `copy_initial_weights=False` to `higher.innerloop_ctx(...)` (or `higher.monkeypatch(...)`): the "
               "fast weights of `fnet` then start from the root module's own parameters, and the meta-gradient "
               "reaches them")


def test_higher_maml_with_copy_initial_weights_false_trains_under_a_monitor_with_no_finding() -> None:
    require_module("higher")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert _attached("higher_maml.py").findings == []
    # leafwatch read no `.grad` of higher's fast weights (non-leaves: torch warns at such a read)
    assert not [w for w in caught if "not a leaf Tensor is being accessed" in str(w.message)], caught


def test_the_fast_weights_higher_keeps_in_a_plain_list_are_no_orphan_and_a_users_list_is() -> None:
    higher = require_module("higher")
    from torch import nn

    from leafwatch.observe.inventory import Inventory, functional_copy

    net = nn.Sequential(nn.Linear(4, 3))
    fnet = higher.monkeypatch(net, copy_initial_weights=True)
    assert isinstance(vars(fnet)["_fast_params"], list) and functional_copy(fnet) and not functional_copy(net)
    assert Inventory(fnet).orphans() == []  # higher's own storage, in higher's object

    class Mine(nn.Module):  # the same plain list of leaves, in the user's own module
        def __init__(self) -> None:
            super().__init__()
            self.fast = [[p.detach().clone().requires_grad_() for p in net.parameters()]]

    assert {o.name for o in Inventory(Mine()).orphans()} == {"fast[0][0]", "fast[0][1]"}


def test_higher_maml_with_its_default_copy_initial_weights_is_named_with_that_cause_and_fix() -> None:
    require_module("higher")
    (f,) = _attached("higher_maml.py", "--copy").findings
    assert (f.kind, f.severity, f.reason.name) == ("missing_grad", "error", "copied_weights")
    assert (f.name, f.details["location"]) == ("{0,2}.{bias,weight}", "weights copied into `fnet`")
    assert {m.name for m in f.members} == {"0.weight", "0.bias", "2.weight", "2.bias"}
    assert (f.cause, f.fix) == (_COPIED_CAUSE, _COPIED_FIX)


def test_the_users_own_monitor_variable_is_never_walked_into() -> None:
    """The script keeps ``monitor = Monitor(...)``: no finding names it, or anything reached through it
    (it holds the roots and leafwatch's records), beside a test's Monitor and under leafwatch run."""
    require_module("higher")
    assert _attached("higher_maml.py", "--own-monitor").findings == []
    (f,) = _attached("higher_maml.py", "--copy", "--own-monitor").findings
    assert f.details["location"] == "weights copied into `fnet`" and "monitor" not in f.cause + f.fix
    result = _leafwatch_run("higher_maml.py", "--copy", "--own-monitor")
    assert "ERROR   missing_grad        {0,2}.{bias,weight}, weights copied into `fnet` (since step 1)" \
        in result.stderr, result.stderr
    assert "monitor" not in result.stderr and "orphan" not in result.stderr and "_fast_params" not in result.stderr


def test_leafwatch_run_of_higher_maml_names_copy_initial_weights() -> None:
    require_module("higher")
    result = _leafwatch_run("higher_maml.py", "--copy")
    assert "leafwatch: 1 open of 1 finding(s) at step 3" in result.stderr, result.stderr
    assert f"cause: {_COPIED_CAUSE}" in result.stderr and f"fix (advice): {_COPIED_FIX}" in result.stderr
    clean = _leafwatch_run("higher_maml.py")
    assert "leafwatch: summary after 3 optimizer steps\nleafwatch: no findings at step 3" in clean.stderr, clean.stderr
    assert "never ran through `module(x)`" not in clean.stderr  # its gradients came through higher's copy
