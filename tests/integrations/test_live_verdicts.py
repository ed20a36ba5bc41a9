"""A live verdict agrees with the final report: no error is printed at a check (nor raised in strict mode)
that the end of the run resolves without any change to the script, and an error leafwatch prints is true.

Each pattern is a faithful plain-torch rebuild of a public project's code (the library and file are named in
each script's docstring), run under ``leafwatch run`` (plain and ``--strict``), beside the true bug it looks like,
which is still named, with its cause, at the first check where it can be known."""

from __future__ import annotations

import os
import random
import subprocess
import sys
import warnings
from pathlib import Path

import _warm
import pytest
import torch
from _requirements import require_module
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import leafwatch
from leafwatch import LeafWatch, LeafwatchError

REPO = Path(__file__).resolve().parents[2]
SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"


def _run(script: str, *args: str, strict: bool = False) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    command = [sys.executable, "-m", "leafwatch", "run", *(["--strict"] if strict else []), str(SCRIPTS / script), *args]
    result = _warm.run(command, capture_output=True, text=True, env=env, cwd=REPO, timeout=240)
    assert "LeafwatchInternalWarning" not in result.stderr, result.stderr
    return result


def _live(result: subprocess.CompletedProcess) -> list[str]:
    """The console lines printed at the checks (before the summary)."""
    before = result.stderr.split("leafwatch: summary after")[0]
    return [line for line in before.splitlines() if line.startswith("leafwatch: ")]


def _summary(result: subprocess.CompletedProcess) -> str:
    return result.stderr.split("leafwatch: summary after")[1]


# -- item: an optimizer that steps later in the same iteration ----------------------------------------
@pytest.mark.parametrize("script", ["loss_optimizer.py", "sac_per_group.py"])
@pytest.mark.parametrize("strict", [False, True])
def test_an_optimizer_built_before_the_check_and_stepped_later_in_the_iteration_holds_its_tensors(script, strict):
    """pytorch-metric-learning's ``loss_optimizer`` (stepped after the model's ``optimizer``) and torchrl's SAC
    with one optimizer per loss group: the tensors they hold were created after the first optimizer was built,
    and that one steps first. Each optimizer counts from the moment it is built: no live error, nothing at the end."""
    result = _run(script, strict=strict)
    assert result.returncode == 0, result.stderr
    assert result.stdout == "done\n"
    assert _live(result) == [], result.stderr
    assert "leafwatch: no findings at step" in _summary(result)
    assert "created at" not in result.stderr


def test_a_loss_parameter_left_out_of_every_optimizer_is_still_named():
    """The bug beside pytorch-metric-learning's pattern: no ``loss_optimizer`` (its documentation: "This loss
    requires an optimizer"). ``loss_func.W`` gets gradients and never changes: named at the second check (the
    first shows its gradient, the second that its value did not change), a warning, as a whole module no
    optimizer holds is (a forgotten optimizer, or a fixed network)."""
    result = _run("loss_optimizer.py", "--forget-loss-optimizer")
    assert result.returncode == 0, result.stderr
    assert _live(result)[0].startswith(
        "leafwatch: WARNING not_in_optimizer `loss_func.W` seen at step 1, decided at step 2.")
    summary = _summary(result)
    assert "WARNING not_in_optimizer    loss_func.W (since step 1, decided at step 2)" in summary
    assert "no optimizer holds `loss_func` (none of its tensors)" in summary


def test_a_loss_parameter_no_optimizer_holds_is_still_named():
    """The bug beside torchrl's pattern: ``log_alpha`` has no optimizer. Built before the last optimizer, it may
    be stepped by one that steps late (``leafwatch run`` waits 25 checks for one): named, an error, at the end of
    this shorter run; the Q-value copies its optimizer holds are no finding at any point."""
    result = _run("sac_per_group.py", "--forget-alpha")
    assert result.returncode == 0, result.stderr
    assert [line.split(" at step")[0] for line in _live(result)] == [
        "leafwatch: ERROR not_in_optimizer `loss_module.log_alpha` seen"]
    summary = _summary(result)
    assert "ERROR   not_in_optimizer    loss_module.log_alpha (since step 1" in summary
    assert "qvalue_network_params" not in result.stderr


# -- item: layer dropout is no error at step 1 -----------------------------------------------------
class LayerNorm(nn.Module):
    """x-transformers' bias-less ``LayerNorm``: a LayerNorm without affine parameters, times ``gamma``."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.ln = nn.LayerNorm(dim, elementwise_affine=False)
        self.gamma = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.ln(x) * self.gamma


class Attention(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.to_q, self.to_k, self.to_v = (nn.Linear(dim, dim, bias=False) for _ in range(3))
        self.to_out = nn.Linear(dim, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, d = x.shape
        q, k, v = (f(x).view(b, n, self.heads, -1).transpose(1, 2) for f in (self.to_q, self.to_k, self.to_v))
        out = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.to_out(out.transpose(1, 2).reshape(b, n, d))


class FeedForward(nn.Module):
    def __init__(self, dim: int, mult: int = 4) -> None:
        super().__init__()
        self.ff = nn.Sequential(nn.Sequential(nn.Linear(dim, dim * mult), nn.GELU()), nn.Identity(),
                                nn.Linear(dim * mult, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.ff(x)


class Residual(nn.Module):
    def forward(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        return x + residual


class Decoder(nn.Module):
    """x-transformers' ``AttentionLayers`` (``x_transformers.py``) as ``Decoder(layer_dropout=...)`` builds it:
    ``layer_types`` alternate attention and feedforward, ``self.layer_dropouts = cast_tuple(layer_dropout,
    len(layer_types))``, each item of ``self.layers`` is ``ModuleList([norms, block, residual])``, and the forward
    skips a layer with ``if self.training and layer_dropout > 0. and random() < layer_dropout: continue``.
    ``skip_last``: the loop leaves out the last layer (an off-by-one: the bug beside the pattern)."""

    def __init__(self, dim: int, depth: int, heads: int, layer_dropout: float = 0.0, skip_last: bool = False) -> None:
        super().__init__()
        self.layer_types = ("a", "f") * depth
        self.layer_dropouts = (layer_dropout,) * len(self.layer_types)
        self.skip_last = skip_last
        self.layers = nn.ModuleList([])
        for layer_type in self.layer_types:
            block = Attention(dim, heads) if layer_type == "a" else FeedForward(dim)
            self.layers.append(nn.ModuleList([nn.ModuleList([LayerNorm(dim), None, None]), block, Residual()]))
        self.final_norm = LayerNorm(dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        types = self.layer_types[:-1] if self.skip_last else self.layer_types
        for layer_type, (norm, block, residual_fn), layer_dropout in zip(types, self.layers, self.layer_dropouts):
            if self.training and layer_dropout > 0. and random.random() < layer_dropout:
                continue
            inner_residual = x
            x = residual_fn(block(norm[0](x)), inner_residual)
        return self.final_norm(x)


class TransformerWrapper(nn.Module):
    def __init__(self, num_tokens: int, attn_layers: Decoder, dim: int) -> None:
        super().__init__()
        self.token_emb = nn.Embedding(num_tokens, dim)
        self.attn_layers = attn_layers
        self.to_logits = nn.Linear(dim, num_tokens, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.to_logits(self.attn_layers(self.token_emb(x)))


class AutoregressiveWrapper(nn.Module):
    """x-transformers' ``AutoregressiveWrapper``: the wrapped net as ``self.net``, the next-token loss."""

    def __init__(self, net: TransformerWrapper) -> None:
        super().__init__()
        self.net = net

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        logits = self.net(x[:, :-1])
        return nn.functional.cross_entropy(logits.transpose(1, 2), x[:, 1:])


def _language_model(layer_dropout: float, skip_last: bool = False):
    pl = require_module("pytorch_lightning")

    class LanguageModel(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = AutoregressiveWrapper(TransformerWrapper(
                num_tokens=64, dim=32, attn_layers=Decoder(dim=32, depth=4, heads=2, layer_dropout=layer_dropout,
                                                           skip_last=skip_last)))

        def training_step(self, batch, batch_idx):
            return self.net(batch[0])

        def configure_optimizers(self):
            return torch.optim.Adam(self.parameters(), lr=1e-3)

    return LanguageModel()


def _fit(model, callback, steps: int) -> tuple[list[str], dict[int, set[int]]]:
    """Fit ``steps`` steps; the leafwatch warnings, and the layers each step skipped (by forward hooks)."""
    pl = require_module("pytorch_lightning")
    layers = model.net.net.attn_layers.layers
    ran: set[int] = set()
    skipped: dict[int, set[int]] = {}
    handles = [layer[1].register_forward_hook(lambda m, a, o, i=i: ran.add(i)) for i, layer in enumerate(layers)]

    class Skips(pl.Callback):
        def on_train_batch_end(self, trainer, *args) -> None:
            skipped[trainer.global_step] = set(range(len(layers))) - ran
            ran.clear()

    g = torch.Generator().manual_seed(0)
    data = DataLoader(TensorDataset(torch.randint(0, 64, (8 * steps, 16), generator=g)), batch_size=8)
    trainer = pl.Trainer(max_steps=steps, accelerator="cpu", devices=1, logger=False, callbacks=[callback, Skips()],
                         enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False)
    try:
        with warnings.catch_warnings(record=True) as record:
            warnings.simplefilter("always")
            trainer.fit(model, data)
    finally:
        for handle in handles:
            handle.remove()
    return [str(w.message) for w in record if issubclass(w.category, leafwatch.LeafwatchWarning)], skipped


def test_layer_dropout_is_no_error_at_step_1_nor_in_strict_mode():
    """x-transformers' ``Decoder(layer_dropout=0.5)`` under the Lightning callback with ``strict=True``: layers
    skipped at step 1 while their siblings ran print nothing and raise nothing; the end says what the run
    showed (the layers are skipped at some steps: ``intermittent`` information)."""
    random.seed(0)
    torch.manual_seed(0)
    callback = LeafWatch(strict=True)
    said, skipped = _fit(_language_model(0.5), callback, steps=8)
    assert skipped[1] and len(skipped[1]) < 8, "the seed must skip some layers, not all, at step 1"
    assert said == []
    report = callback.report
    assert report.open == [] and report.step == 8
    (found,) = report.findings
    assert (found.kind, found.name, found.status, found.severity) == (
        "missing_grad", "net.net.attn_layers.layers", "intermittent", "info")
    assert "LayerDrop" in found.message


def test_a_layer_the_loop_never_calls_beside_layer_dropout_is_named_once_chance_cannot_explain_it():
    """The bug beside the pattern: the loop leaves out the last layer of a ``Decoder(layer_dropout=0.1)``. The
    declared rate says how long a random drop can explain it: named (strict mode raises) at the first check where
    ``0.1 ** checks < 1e-9``, with the cause, and nothing is printed before."""
    random.seed(0)
    torch.manual_seed(0)
    callback = LeafWatch(strict=True)
    with pytest.raises(LeafwatchError, match=r"missing_grad\s+net\.net\.attn_layers\.layers\.7") as raised:
        _fit(_language_model(0.1, skip_last=True), callback, steps=20)
    report = raised.value.report
    assert report.step == 10  # 0.1 ** 9 == 1.0000000000000006e-09 is not below 1e-09; 0.1 ** 10 is
    (found,) = report.open
    assert (found.kind, found.name, found.status, found.severity) == (
        "missing_grad", "net.net.attn_layers.layers.7", "open", "error")
    assert found.cause.startswith("module `net.net.attn_layers.layers.7` never ran in this step's forward (`net.net.attn_layers` ran")
    assert "Its siblings in `net.net.attn_layers.layers` ran: skipped at all 10 checks" in found.cause


def test_a_step_that_drops_every_layer_is_no_evidence_against_layer_dropout():
    """x-transformers' ``Decoder(layer_dropout=0.5)`` of two layers under ``Monitor.attach()`` in strict mode: the
    seed drops layer 0 at step 1 while layer 1 runs, then both layers for four steps (no sibling runs: the stack
    seen dropping some layers only still explains it), and layer 0 runs at step 6: never an error."""
    random.seed(18)
    torch.manual_seed(0)
    model = AutoregressiveWrapper(TransformerWrapper(num_tokens=64, dim=32, attn_layers=Decoder(
        dim=32, depth=1, heads=2, layer_dropout=0.5)))
    layers = model.net.attn_layers.layers
    ran: set[int] = set()
    for i, layer in enumerate(layers):
        layer[1].register_forward_hook(lambda m, a, o, i=i: ran.add(i))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    skipped = []
    with leafwatch.Monitor(model, opt, strict=True).attach() as monitor:
        for step in range(6):
            ran.clear()
            opt.zero_grad()
            model(torch.randint(0, 64, (4, 16))).backward()
            opt.step()  # strict: raises at an open error
            skipped.append({0, 1} - ran)
    assert skipped == [{0}, {0, 1}, {0, 1}, {0, 1}, {0, 1}, {1}], "the seed must give this pattern"
    report = monitor.report
    assert report.open == []
    assert {(f.kind, f.name, f.status, f.severity) for f in report.findings} == {
        ("missing_grad", "net.attn_layers.layers", "intermittent", "info")}


# -- item: no false finding after a crash, no false statement ----------------------------------------
def test_a_gan_that_dies_before_the_generator_steps_leaves_its_membership_undecided():
    """pytorch/pytorch#39141's GAN: ``G_loss`` computed from ``D``'s output before ``opt_D.step()``, so that
    ``G_loss.backward()`` raises. ``opt_G`` never got the chance to step: ``G`` is left undecided (info), never
    "its step() is never called" nor "add it to opt_D"."""
    result = _run("gan_crash.py")
    assert result.returncode == 1, result.stderr
    assert "modified by an inplace operation" in result.stderr
    assert [line for line in _live(result) if " ERROR " in line or " WARNING " in line] == []
    summary = _summary(result)
    # The crash's finding goes through the history into the summary (#52 item 4), beside G's undecided one.
    assert "leafwatch: 1 open of 2 finding(s) at step 1" in summary
    assert "ERROR   missing_grad        G_loss (since step 1)" in summary
    assert "INFO    not_in_optimizer    G (since step 1)" in summary
    assert ("each of `G.{0,2}.{bias,weight}` requires grad and no optimizer that stepped holds it, but the run raised "
            "an exception at step 1, before the checks that decide whether it trains: left undecided.") in summary
    assert "`opt_G` (an `Adam`) holds it and had not stepped yet: it may step later in the iteration" in summary
    live = _live(result)
    # The crash's note (#53) names what raised: `opt_D.step()` changed D's weights before `G_loss.backward()`; it
    # says nothing of `opt_G`, which never got to step.
    note = [line for line in live if line.startswith(("leafwatch: `opt_D.step()`", "leafwatch: cause: an optimizer's",
                                                       "leafwatch: fix (code): compute `G_loss` again"))]
    assert len(note) == 3 and note[0].startswith("leafwatch: `opt_D.step()` at gan_crash.py:38 changed in place the "
                                                 "parameters of `D` that the graph of `G_loss`"), live
    assert "opt_G" not in "\n".join(note)
    undecided = summary[summary.index("INFO    not_in_optimizer    G"):]  # what is said of G, the crash's finding aside
    said = "\n".join(line for line in live if line not in note) + undecided  # (the traceback quotes the script)
    for false in ("never called", "never stepped", "left out", "opt_D", "ERROR"):
        assert false not in said, false
    strict = _run("gan_crash.py", strict=True)  # the script's own exit code, no strict failure of leafwatch's
    assert strict.returncode == 1 and "--strict: the run ended with" not in strict.stderr, strict.stderr


def test_a_generator_optimizer_that_never_steps_in_a_whole_run_is_named_with_its_cause():
    """The bug beside it: the loop in the right order, ``opt_G.step()`` never called, the run goes to its end.
    The optimizer is gone with the script when the run ends; the one seen holding ``G`` while it waited is named."""
    result = _run("gan_crash.py", "--no-g-step")
    assert result.returncode == 0, result.stderr
    summary = _summary(result)
    assert "ERROR   not_in_optimizer    G (since step 1, decided at step 5)" in summary
    assert "`opt_G` (an `Adam`) was created with it, but its `step()` is never called" in summary
    assert "fix (code): call `opt_G.step()` after the backward pass" in summary
    assert "left out" not in summary and "opt_D" not in summary


def test_a_monitor_left_by_an_exception_leaves_an_unstepped_optimizers_tensors_undecided():
    """The same GAN under ``Monitor.attach()`` given both optimizers, in a ``with`` block the exception leaves:
    ``opt_G`` held ``G`` and had not stepped yet when the script died."""
    torch.manual_seed(0)
    G = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    D = nn.Sequential(nn.Linear(4, 16), nn.LeakyReLU(0.2), nn.Linear(16, 1))
    opt_G, opt_D = torch.optim.Adam(G.parameters(), lr=2e-4), torch.optim.Adam(D.parameters(), lr=2e-4)
    bce = nn.BCEWithLogitsLoss()
    monitor = leafwatch.Monitor(nn.ModuleDict({"G": G, "D": D}), [opt_D, opt_G]).attach()
    with pytest.raises(RuntimeError, match="modified by an inplace operation"), monitor:
        for _ in range(5):
            opt_D.zero_grad()
            opt_G.zero_grad()
            fake = G(torch.randn(16, 8))
            D_real, D_fake = D(torch.randn(16, 4)), D(fake)
            D_loss = bce(D_real, torch.ones_like(D_real)) + bce(D_fake, torch.zeros_like(D_fake))
            G_loss = bce(D_fake, torch.ones_like(D_fake))
            D_loss.backward(retain_graph=True)
            opt_D.step()
            G_loss.backward()
            opt_G.step()
    report = monitor.report
    # The crash's finding is the one open finding: it went through the history (#52 item 4).
    assert [(f.kind, f.name, f.reason.name) for f in report.open] == [("missing_grad", "G_loss", "stepped_before_backward")]
    (found,) = report.by_kind("not_in_optimizer")
    assert (found.kind, found.name, found.severity, found.status) == ("not_in_optimizer", "G", "info", "open")
    assert found.message.endswith("left undecided.")
    assert "`opt_G` (an `Adam`) holds it and had not stepped yet" in found.cause


def test_the_script_calls_forward_directly_only_where_a_forward_call_was_seen():
    """``model.forward(x)`` is seen in the script's source, with its line."""
    result = _run("forward_called_directly.py")
    assert result.returncode == 0, result.stderr
    assert ("the script calls `.forward()` directly, where module hooks cannot see (`model.forward(...)` at "
            "forward_called_directly.py:12)") in result.stderr


def test_a_class_with_its_own_call_is_said_to_run_through_it_not_to_call_forward():
    """gpytorch's ``Module.__call__`` pattern: the script calls ``model(train_x)``; the hooks never fire."""
    result = _run("own_call.py")
    assert result.returncode == 0, result.stderr
    assert "leafwatch: no findings at step 5" in result.stderr
    assert ("modules whose tensors got gradients and were stepped ran through their class's own `__call__` "
            "(`likelihood`, `model.covar_module`, `model.mean_module`: `__main__.Module.__call__`), which runs "
            "`forward` without torch's module hooks.") in result.stderr
    assert "calls `.forward()` directly" not in result.stderr


def test_a_parameter_a_module_with_its_own_call_never_uses_is_named_with_that_cause():
    """The bug beside it: the mean registers an ``offset`` its forward never uses."""
    result = _run("own_call.py", "--unused-parameter")
    assert _live(result)[0].startswith("leafwatch: ERROR missing_grad `mean_module.offset` at step 1.")
    assert ("its forward hooks never ran: its class's own `__call__` (`__main__.Module.__call__`) runs `forward` "
            "without torch's module hooks") in _summary(result)
    assert ".forward()` directly" not in result.stderr and "call the module itself" not in result.stderr


def test_a_table_read_without_calling_its_module_is_not_said_to_be_called_through_forward():
    """``emb.weight[idx]``: no module call, no ``.forward()`` call."""
    result = _run("embedding_weight_read.py")
    assert result.returncode == 0, result.stderr
    assert "leafwatch: no findings at step 4" in result.stderr
    assert ("modules whose tensors got gradients and were stepped never ran through `module(x)` (`emb`): their "
            "tensors are used without a call of the module that module hooks see (read directly") in result.stderr
    assert "calls `.forward()` directly" not in result.stderr


def test_a_module_never_called_is_said_to_have_never_run_at_the_first_check():
    """A global ``aux = nn.Linear(...)`` handed to the optimizer and never called."""
    result = _run("aux_never_called.py")
    assert result.returncode == 0, result.stderr
    assert _live(result) == ["leafwatch: ERROR missing_grad `aux` (2 tensors: aux.{bias,weight}) at step 1. Fix "
                             "(advice): call `aux` in forward(), or remove it (or freeze it with requires_grad_(False) "
                             "if that is intended); if that is intended, silence it: `ignore=[\"aux.*\"]`"]
    summary = _summary(result)
    assert "cause: module `aux` never ran in this step's forward." in summary
    assert "unknown" not in summary and "probably used outside any module's forward" not in summary
    assert ".forward()" not in result.stderr
