"""The loop that applies no gradient: cleared before the step, lr stuck at 0, steps always skipped.

Each bug is named through ``Monitor.check()``, ``attach()``, ``leafwatch run`` (and, for the
learning rate, the Lightning callback), and each legitimate twin (gradients withheld for the
first steps on purpose, warm-up from 0, a group frozen with lr 0, a decay that reaches 0 at the
end, a few skipped AMP steps at the start) gives no finding above info.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import _warm
import pytest
from _requirements import require_module
import torch
from torch import nn

import leafwatch
from leafwatch.detectors import loop as stepping
from leafwatch.observe.loop import StepSentinels
from leafwatch.observe.structure import CheckList

REPO = Path(__file__).resolve().parents[2]
CLEARED_CAUSE = ("gradients arrived in backward and were cleared before the optimizer step: "
                 "`zero_grad()` is called between `backward()` and `step()`")
# the user's optimizer by its variable (`opt` in the tests below)
CLEARED_FIX = "call `opt.zero_grad()` before the forward pass (or right after `opt.step()`)"


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Linear(4, 8)
        self.head = nn.Linear(8, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.relu(self.body(x)))


class DinoHead(nn.Module):
    """DINO's projection head: a weight-normalized last layer whose gradients are cancelled
    during the first epoch (``utils.cancel_gradients_last_layer`` in facebookresearch/dino)."""

    def __init__(self) -> None:
        super().__init__()
        self.mlp = nn.Linear(4, 8)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)  # nn.utils.weight_norm, as DINO uses it
            self.last_layer = nn.utils.weight_norm(nn.Linear(8, 6, bias=False))
        self.last_layer.weight_g.data.fill_(1)
        self.last_layer.weight_g.requires_grad = False  # norm_last_layer=True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = nn.functional.normalize(self.mlp(x), dim=-1)
        return self.last_layer(x)


def cancel_gradients_last_layer(epoch: int, model: nn.Module, freeze_last_layer: int) -> None:
    if epoch >= freeze_last_layer:
        return
    for n, p in model.named_parameters():
        if "last_layer" in n:
            p.grad = None


def _batch() -> torch.Tensor:
    return torch.randn(8, 4)


def _above_info(report: leafwatch.Report) -> list[leafwatch.Finding]:
    return [f for f in report if f.severity != "info"]


# -- 1. gradients cleared between backward and step ------------------------------------------------
def test_zero_grad_between_backward_and_step_is_one_error_on_the_optimizer_with_attach():
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    monitor = leafwatch.Monitor(model, opt).attach()
    for _ in range(3):
        model(_batch()).pow(2).mean().backward()
        opt.zero_grad()  # the bug: the gradients are gone before the step
        opt.step()
    report = monitor.close()
    (finding,) = report.findings
    assert (finding.kind, finding.name, finding.severity, finding.status) == ("grad_cleared", "optimizers[0]", "error", "open")
    assert finding.cause == CLEARED_CAUSE + "."
    assert finding.fix == CLEARED_FIX
    assert set(finding.aliases) == {"body.weight", "body.bias", "head.weight", "head.bias"}
    assert "4 tensors" in finding.message
    assert not report.by_kind("missing_grad"), "no per-parameter missing_grad with a wrong cause"


def test_zero_grad_between_backward_and_step_through_check():
    model = Net()
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    with leafwatch.Monitor(model, opt) as monitor:
        for _ in range(2):
            model(_batch()).sum().backward()
            opt.zero_grad(set_to_none=True)
            report = monitor.check(opt)
            opt.step()
    assert [(f.kind, f.name, f.severity) for f in report.open] == [("grad_cleared", "optimizers[0]", "error")]
    assert report.open[0].cause.startswith(CLEARED_CAUSE)


def test_the_cleared_error_leaves_a_really_unused_head_to_missing_grad():
    class WithAux(Net):
        def __init__(self) -> None:
            super().__init__()
            self.aux = nn.Linear(8, 1)  # never called

    model = WithAux()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    monitor = leafwatch.Monitor(model, opt).attach()
    for _ in range(2):
        model(_batch()).sum().backward()
        opt.zero_grad()
        opt.step()
    report = monitor.close()
    (cleared,) = report.by_kind("grad_cleared")
    assert cleared.severity == "error" and set(cleared.aliases) == {"body.weight", "body.bias", "head.weight", "head.bias"}
    assert report.names("missing_grad") == {"aux.weight", "aux.bias"}
    assert all("never ran" in f.cause for f in report.by_kind("missing_grad"))


class _ScaleWithoutGradient(torch.autograd.Function):
    """``x * scale`` whose backward returns None for ``scale``: torch still calls its hooks."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
        return x * scale.detach()

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return grad, None


class _ScaledNet(Net):
    def __init__(self) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.ones(1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _ScaleWithoutGradient.apply(super().forward(x), self.scale)


@pytest.mark.parametrize("attach", [False, True])
def test_a_hook_called_with_no_gradient_is_no_arrival_and_the_parameter_is_missing_grad(attach):
    model = _ScaledNet()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    monitor = leafwatch.Monitor(model, opt)
    watched = leafwatch.Monitor(model, opt, tensors={"scale": model.scale}, verbose=False)
    if attach:
        monitor.attach()
    for _ in range(3):
        opt.zero_grad()
        model(_batch()).sum().backward()
        if not attach:
            monitor.check(opt)
        opt.step()
    report = monitor.close()
    assert model.scale.grad is None
    assert report.names("missing_grad") == {"scale"}, str(report)
    assert not report.by_kind("grad_cleared"), "a hook torch called with None is no gradient that was cleared"
    watched_entry, = watched.watches.entries()
    assert watched_entry.grads_seen == 0
    watched.close()


def test_the_cleared_error_is_ignored_through_its_tensors_names():
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    monitor = leafwatch.Monitor(model, opt, ignore={"head.*": "probing only"}).attach()
    model(_batch()).sum().backward()
    opt.zero_grad()
    opt.step()
    (finding,) = monitor.close().findings
    assert (finding.kind, finding.status) == ("grad_cleared", "ignored")
    assert finding.details["ignored_because"] == "probing only"


def test_the_cleared_error_resolves_once_the_loop_is_fixed():
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    monitor = leafwatch.Monitor(model, opt).attach()
    for step in range(4):
        if step >= 2:
            opt.zero_grad()  # fixed: cleared before the forward pass
        model(_batch()).sum().backward()
        if step < 2:
            opt.zero_grad()
        opt.step()
    report = monitor.close()
    (finding,) = report.findings
    assert (finding.kind, finding.status, finding.last_step) == ("grad_cleared", "resolved", 3)
    assert monitor.stats()["arrival_hooks"] == 0


@pytest.mark.parametrize(("strict",), [(False,), (True,)])
def test_last_layer_gradients_cancelled_during_the_first_epoch_are_information(strict):
    model = DinoHead()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    monitor = leafwatch.Monitor(model, opt, strict=strict).attach()
    infos = []
    for epoch in range(3):
        for _ in range(3):
            opt.zero_grad()
            model(_batch()).pow(2).mean().backward()
            cancel_gradients_last_layer(epoch, model, freeze_last_layer=1)
            opt.step()  # strict: raises at an error finding
            infos += [f for f in monitor.report if f.kind == "grad_cleared" and f.status == "open"]
    report = monitor.close()
    assert not _above_info(report)
    assert {f.name for f in infos} == {"last_layer.weight_v"}
    finding = infos[0]
    assert finding.severity == "info"
    assert "backward reached `last_layer.weight_v`; the training loop cleared its gradient" in finding.cause
    assert "resumes later" in finding.cause
    (resolved,) = report.by_kind("grad_cleared")
    assert resolved.status == "resolved" and "has trained since" in resolved.message
    assert (resolved.reason.name, resolved.reason.observed) == ("clearing_ended", "cleared_on_purpose")
    assert not report.by_kind("missing_grad")


def test_a_head_held_back_during_warm_up_is_information_through_check():
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with leafwatch.Monitor(model, opt) as monitor:
        for step in range(6):
            opt.zero_grad()
            model(_batch()).sum().backward()
            if step < 3:
                for p in model.head.parameters():
                    p.grad = None
            report = monitor.check(opt)
            if step < 3:
                assert {(f.kind, f.name, f.severity) for f in report.tensors() if f.status == "open"} == {
                    ("grad_cleared", "head.weight", "info"), ("grad_cleared", "head.bias", "info")}
                assert [(f.kind, f.name) for f in report if f.status == "open"] == [("grad_cleared", "head")]
            opt.step()
    assert not monitor.report.open
    assert {f.status for f in monitor.report} == {"resolved"}


def test_a_new_clearing_after_healthy_steps_is_told_apart_at_the_next_check():
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    monitor = leafwatch.Monitor(model, opt).attach()
    for step in range(6):
        opt.zero_grad()
        model(_batch()).sum().backward()
        if step >= 3:
            model.head.weight.grad = None  # withheld from step 4 on
        opt.step()
    report = monitor.close()
    (finding,) = report.by_kind("grad_cleared")
    assert (finding.name, finding.severity) == ("head.weight", "info")
    assert not _above_info(report)


# -- 2. a learning rate stuck at 0 -------------------------------------------------------------------
def _train_with_schedule(make_scheduler, steps: int, *, groups=None, frozen: bool = False,
                         monitor_kwargs=None) -> leafwatch.Report:
    model = Net()
    if frozen:
        model.head.requires_grad_(False)
    opt = torch.optim.SGD(groups(model) if groups else model.parameters(), lr=0.1)
    sched = make_scheduler(opt)
    monitor = leafwatch.Monitor(model, opt, **(monitor_kwargs or {})).attach()
    for _ in range(steps):
        opt.zero_grad()
        model(_batch()).sum().backward()
        opt.step()
        if sched is not None:
            sched.step()
    return monitor.close()


def test_a_schedule_that_returns_0_is_a_warning_naming_the_group_and_the_scheduler():
    steps = stepping.LR_ZERO_AFTER + 20
    report = _train_with_schedule(lambda opt: torch.optim.lr_scheduler.LambdaLR(opt, lambda step: 0.0), steps)
    (finding,) = report.findings
    assert (finding.kind, finding.name, finding.severity) == ("no_update", "optimizers[0].param_groups[0]", "warning")
    assert set(finding.aliases) == {"body.weight", "body.bias", "head.weight", "head.bias"}
    assert "has stepped with lr 0 for" in finding.message and "since step 1)" in finding.message
    assert "`LambdaLR`" in finding.cause and "`initial_lr` is 0.1" in finding.cause
    assert "LambdaLR" in finding.fix
    assert finding.details["scheduler"] == "LambdaLR"


def test_an_lr_set_to_0_by_hand_is_a_warning_with_the_value_it_was_built_with():
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with leafwatch.Monitor(model, opt) as monitor:
        for step in range(stepping.LR_ZERO_AFTER + 30):
            if step == 5:
                opt.param_groups[0]["lr"] = 0.0
            opt.zero_grad()
            model(_batch()).sum().backward()
            monitor.check(opt)
            opt.step()
    (finding,) = monitor.report.findings
    assert (finding.kind, finding.severity) == ("no_update", "warning")
    assert "was 0.1 when leafwatch first saw it" in finding.cause
    assert finding.details["scheduler"] is None


@pytest.mark.parametrize(
    ("case", "make_scheduler", "steps", "groups", "frozen"),
    [
        ("warm-up from 0", lambda opt: torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, s / 10)), 150, None, False),
        ("linear decay to exactly 0 at the end", lambda opt: torch.optim.lr_scheduler.LambdaLR(opt, lambda s: max(0.0, 1 - s / 148)), 150, None, False),
        ("cosine to 0", lambda opt: torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=150, eta_min=0.0), 150, None, False),
        ("a group built with lr 0 (lr_mult=0)", lambda opt: torch.optim.lr_scheduler.StepLR(opt, 50),
         stepping.LR_ZERO_AFTER + 30, lambda m: [{"params": m.body.parameters(), "lr": 0.0}, {"params": m.head.parameters()}], False),
        ("a frozen group under a schedule at 0", lambda opt: torch.optim.lr_scheduler.LambdaLR(opt, [lambda s: 1.0, lambda s: 0.0]),
         stepping.LR_ZERO_AFTER + 30, lambda m: [{"params": m.body.parameters()}, {"params": m.head.parameters()}], True),
        ("no scheduler", lambda opt: None, stepping.LR_ZERO_AFTER + 30, None, False),
    ],
)
def test_learning_rates_that_are_0_on_purpose_give_no_finding(case, make_scheduler, steps, groups, frozen):
    report = _train_with_schedule(make_scheduler, steps, groups=groups, frozen=frozen)
    # A frozen tensor left in the optimizer is an info finding of its own (frozen_in_optimizer).
    assert [f for f in report if f.kind != "frozen_in_optimizer"] == [], case


def test_a_cuda_tensor_lr_is_never_read():
    assert stepping._number(torch.tensor(0.0, device="meta")) is None
    assert stepping._number(torch.tensor(0.5)) == 0.5
    assert stepping._number(True) is None


# -- 3. steps that are always skipped ----------------------------------------------------------------
def _amp_loop(monitor_of, steps: int, nonfinite_from: int, nonfinite_until: int | None = None):
    torch.manual_seed(0)
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**16)
    monitor = monitor_of(model, opt)
    for step in range(steps):
        opt.zero_grad(set_to_none=True)
        x = _batch()
        if nonfinite_from <= step < (nonfinite_until if nonfinite_until is not None else steps):
            x[0, 0] = float("nan")  # every gradient non-finite: the scaler skips the step
        scaler.scale(model(x).pow(2).mean()).backward()
        if monitor_of is _checked:
            monitor.check(opt)
        scaler.step(opt)
        scaler.update()
    return monitor, scaler


def _attached(model, opt):
    return leafwatch.Monitor(model, opt).attach()


def _checked(model, opt):
    return leafwatch.Monitor(model, opt)


@pytest.mark.parametrize(("monitor_of",), [(_attached,), (_checked,)])
def test_a_grad_scaler_that_skips_every_step_is_reported_once_beside_nonfinite_grad(monitor_of):
    events = []
    monitor, scaler = _amp_loop(monitor_of, 5 + stepping.SKIPPED_AFTER + 10, nonfinite_from=5)
    assert scaler.get_scale() < 1.0, "the scale collapsed"
    report = monitor.close()
    (skipped,) = report.by_kind("no_update")
    assert (skipped.name, skipped.severity, skipped.status) == ("optimizers[0]", "warning", "open")
    skipped_steps = int(re.search(r"has not stepped for (\d+) steps", skipped.message).group(1))
    assert stepping.SKIPPED_AFTER <= skipped_steps <= stepping.SKIPPED_AFTER + 2
    assert "(see the `nonfinite_grad` findings)" in skipped.cause
    assert "`GradScaler` skips `optimizer.step()`" in skipped.cause
    assert "detect_anomaly" in skipped.fix
    assert report.names("nonfinite_grad"), "the non-finite gradients are named beside it"
    assert set(skipped.aliases) == {"body.weight", "body.bias", "head.weight", "head.bias"}


def test_the_skipped_steps_reach_the_sinks_with_attach_though_no_step_is_taken():
    events = []
    monitor, _ = _amp_loop(lambda m, o: leafwatch.Monitor(m, o, sinks=[events.append]).attach(),
                           3 + stepping.SKIPPED_AFTER + 5, nonfinite_from=3)
    assert any(e.report.by_kind("no_update") for e in events)
    monitor.close()


def test_the_skipped_step_hook_asks_for_its_check_through_the_request_check_it_is_given():
    """The loop hooks know no Monitor: a GradScaler's skipped steps reach the callable their owner
    injects, at every backward pass once :data:`SKIPPED_AFTER` were skipped with no other check,
    until a real step ends the run."""
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**16)
    params = list(model.parameters())
    asked, checks = [], [0]

    def request_check(optimizer):  # as a Monitor's check, it moves the step
        asked.append(optimizer)
        checks[0] += 1

    def failed(where, error):
        raise AssertionError(f"{where}: {error}")

    sentinels = StepSentinels(request_check, lambda: checks[0], failed)
    sentinels.track([opt], {0: CheckList(params, ("a", "b", "c", "d"), [None] * 4, frozenset(map(id, params)))})
    for step in range(stepping.SKIPPED_AFTER + 3):
        opt.zero_grad(set_to_none=True)
        x = _batch()
        x[0, 0] = float("nan")
        scaler.scale(model(x).pow(2).mean()).backward()
        assert len(asked) == max(0, step - stepping.SKIPPED_AFTER + 1), step
        scaler.step(opt)
        scaler.update()
    assert all(o is opt for o in asked) and sentinels.alert == {id(opt)}
    for _ in range(2):  # finite gradients: the scaler steps, and the next backward pass sees it
        opt.zero_grad(set_to_none=True)
        scaler.scale(model(_batch()).pow(2).mean()).backward()
        scaler.step(opt)
        scaler.update()
    assert sentinels.alert == set() and sentinels.seen[id(opt)].skipped == 0
    sentinels.close()
    assert sentinels.seen == {}


@pytest.mark.parametrize(("monitor_of",), [(_attached,)])
def test_a_few_skipped_amp_steps_at_the_start_give_no_finding(monitor_of):
    monitor, scaler = _amp_loop(monitor_of, 40, nonfinite_from=0, nonfinite_until=6)
    assert scaler.get_scale() == 2.0**10, "six steps were skipped"
    assert monitor.close().findings == []


def test_gradient_accumulation_is_not_a_skipped_step():
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    monitor = leafwatch.Monitor(model, opt).attach()
    for step in range(3 * stepping.SKIPPED_AFTER):
        model(_batch()).sum().backward()
        if step % 40 == 39:
            opt.step()
            opt.zero_grad()
    assert monitor.close().findings == []


def test_an_lbfgs_closure_with_many_evaluations_is_not_a_skipped_step():
    model = Net()
    opt = torch.optim.LBFGS(model.parameters(), lr=0.1, max_iter=2 * stepping.SKIPPED_AFTER, max_eval=80)
    monitor = leafwatch.Monitor(model, opt).attach()
    x, y = _batch(), torch.randn(8, 1)

    def closure():
        opt.zero_grad()
        loss = (model(x) - y).pow(2).mean()
        loss.backward()
        return loss

    for _ in range(2):
        opt.step(closure)
    assert monitor.close().findings == []


# -- leafwatch run -------------------------------------------------------------------------------
def _run_script(tmp_path: Path, body: str) -> subprocess.CompletedProcess:
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent("""
        import torch
        from torch import nn

        class Net(nn.Module):
            def __init__(self):
                super().__init__()
                self.body = nn.Linear(4, 8)
                self.head = nn.Linear(8, 1)

            def forward(self, x):
                return self.head(torch.relu(self.body(x)))

        torch.manual_seed(0)
        model = Net()
    """) + textwrap.dedent(body))
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    return _warm.run([sys.executable, "-m", "leafwatch", "run", str(script)], capture_output=True,
                     text=True, env=env, cwd=tmp_path, timeout=240)


def test_run_names_zero_grad_between_backward_and_step(tmp_path):
    done = _run_script(tmp_path, """
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(4):
            model(torch.randn(8, 4)).sum().backward()
            opt.zero_grad()
            opt.step()
    """)
    assert done.returncode == 0, done.stderr
    assert "ERROR grad_cleared `optimizers[0]`" in done.stderr
    assert CLEARED_CAUSE in done.stderr
    assert "missing_grad" not in done.stderr


def test_run_gives_no_error_for_gradients_withheld_during_warm_up(tmp_path):
    done = _run_script(tmp_path, """
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for step in range(8):
            opt.zero_grad()
            model(torch.randn(8, 4)).sum().backward()
            if step < 4:
                model.head.weight.grad = None
            opt.step()
    """)
    assert done.returncode == 0, done.stderr
    assert "ERROR" not in done.stderr and "WARNING" not in done.stderr, done.stderr


def test_run_names_a_schedule_stuck_at_0_and_its_scheduler(tmp_path):
    done = _run_script(tmp_path, f"""
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: 0.0)
        for _ in range({stepping.LR_ZERO_AFTER + 20}):
            opt.zero_grad()
            model(torch.randn(8, 4)).sum().backward()
            opt.step()
            sched.step()
    """)
    assert done.returncode == 0, done.stderr
    assert "WARNING no_update `optimizers[0].param_groups[0]`" in done.stderr
    assert "`LambdaLR`" in done.stderr


def test_run_names_a_grad_scaler_that_skips_every_step(tmp_path):
    done = _run_script(tmp_path, f"""
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        scaler = torch.amp.GradScaler("cpu")
        for step in range({5 + stepping.SKIPPED_AFTER + 5}):
            opt.zero_grad()
            x = torch.randn(8, 4)
            if step >= 5:
                x[0, 0] = float("nan")
            scaler.scale(model(x).pow(2).mean()).backward()
            scaler.step(opt)
            scaler.update()
    """)
    assert done.returncode == 0, done.stderr
    assert f"WARNING no_update `optimizers[0]`" in done.stderr
    assert re.search(r"has not stepped for 3\d steps", done.stderr)
    assert "nonfinite_grad" in done.stderr


# -- the Lightning callback (Lightning owns the loop: the learning rate applies) ---------------------
def _lightning_fit(tmp_path: Path, lr_lambda, *, steps: int, frozen_group_lr: float | None = None) -> leafwatch.Report:
    pl = require_module("pytorch_lightning")
    from torch.utils.data import DataLoader, TensorDataset

    class Scheduled(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.body = nn.Linear(4, 8)
            self.head = nn.Linear(8, 1)

        def training_step(self, batch, batch_idx):
            x, y = batch
            return nn.functional.mse_loss(self.head(torch.relu(self.body(x))), y)

        def configure_optimizers(self):
            groups = [{"params": self.body.parameters()}]
            groups.append({"params": self.head.parameters(), **({} if frozen_group_lr is None else {"lr": frozen_group_lr})})
            opt = torch.optim.SGD(groups, lr=0.1)
            sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_lambda)
            return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}

    g = torch.Generator().manual_seed(0)
    data = DataLoader(TensorDataset(torch.randn(32, 4, generator=g), torch.randn(32, 1, generator=g)), batch_size=4)
    callback = leafwatch.LeafWatch(verbose=False)
    trainer = pl.Trainer(max_steps=steps, accelerator="cpu", devices=1, logger=False, callbacks=[callback],
                         enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False,
                         limit_val_batches=0, default_root_dir=tmp_path)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # Lightning's advice on workers and logging
        trainer.fit(Scheduled(), data)
    return callback.report


def test_lightning_names_a_schedule_stuck_at_0_and_its_scheduler(tmp_path):
    report = _lightning_fit(tmp_path, lambda step: 0.0, steps=stepping.LR_ZERO_AFTER + 20)
    assert {(f.kind, f.name, f.severity) for f in report.open} == {
        ("no_update", "optimizers[0].param_groups[0]", "warning"), ("no_update", "optimizers[0].param_groups[1]", "warning")}
    finding = report.by_kind("no_update")[0]
    assert "`LambdaLR`" in finding.cause


@pytest.mark.parametrize(("case", "lr_lambda", "frozen_group_lr"), [
    ("warm-up from 0", lambda s: min(1.0, s / 10), None),
    ("a group built with lr 0 beside a constant one", lambda s: 1.0, 0.0),
])
def test_lightning_gives_no_finding_for_learning_rates_at_0_on_purpose(tmp_path, case, lr_lambda, frozen_group_lr):
    report = _lightning_fit(tmp_path, lr_lambda, steps=stepping.LR_ZERO_AFTER + 20, frozen_group_lr=frozen_group_lr)
    assert report.findings == [], case


def test_many_backward_passes_without_a_step_and_with_finite_gradients_give_no_finding():
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    monitor = leafwatch.Monitor(model, opt).attach()
    for _ in range(3):  # a few real steps, then gradients computed for inspection only
        opt.zero_grad()
        model(_batch()).sum().backward()
        opt.step()
    for _ in range(2 * stepping.SKIPPED_AFTER):
        opt.zero_grad()
        model(_batch()).sum().backward()
    assert monitor.close().findings == []


def test_a_healthy_loop_keeps_no_arrival_hook_after_the_first_check():
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    monitor = leafwatch.Monitor(model, opt).attach()
    assert monitor.stats()["arrival_hooks"] == 4, "armed on every trainable tensor until the first check"
    for _ in range(3):
        opt.zero_grad()
        model(_batch()).sum().backward()
        opt.step()
    stats = monitor.stats()
    assert (stats["arrival_hooks"], stats["step_watches"]) == (0, 1)
    assert monitor.close().findings == []
    assert monitor.stats()["step_watches"] == 0
