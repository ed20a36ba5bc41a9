"""Trainable tensors outside the model: they get gradients, but no optimizer steps them."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import leafwatch


def _clip_like() -> tuple[nn.Module, torch.Tensor, torch.optim.Optimizer]:
    model = nn.Linear(4, 4)
    logit_scale = torch.ones([], requires_grad=True)  # created beside the model, never given to the optimizer
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    return model, logit_scale, opt


def _assert_outside(finding: leafwatch.Finding, name: str, severity: str) -> None:
    assert (finding.kind, finding.name, finding.severity) == ("not_in_optimizer", name, severity)
    assert "gets gradients but is in no optimizer" in finding.message
    assert "not passed to any optimizer" in finding.cause
    # the user's optimizer by its variable, its class kept; the tensor by the user's name
    assert f'`opt.add_param_group({{"params": [{name}]}})`' in finding.fix
    assert "your `SGD`" in finding.fix and "AdamW" not in finding.fix


@pytest.mark.parametrize("how", ["watch", "tensors"])
def test_a_watched_leaf_in_no_optimizer_is_not_in_optimizer(how: str) -> None:
    model, logit_scale, opt = _clip_like()
    if how == "watch":
        leafwatch.watch(logit_scale, name="logit_scale")
        monitor = leafwatch.Monitor(model, opt)
    else:
        monitor = leafwatch.Monitor(model, opt, tensors={"logit_scale": logit_scale})
    reports = []
    for _ in range(2):
        (model(torch.randn(2, 4)) * logit_scale.exp()).sum().backward()
        reports.append(monitor.check())
    monitor.close()
    assert reports[0].findings == [], "held at the first gradient: it may be updated by hand"
    (finding,) = reports[1]
    _assert_outside(finding, "logit_scale", "error")
    audited = leafwatch.audit(model, opt, tensors={"logit_scale": logit_scale} if how == "tensors" else None)
    _assert_outside(audited.findings[0], "logit_scale", "error")


def test_a_watched_leaf_in_an_optimizer_is_no_finding() -> None:
    model, logit_scale, _ = _clip_like()
    opt = torch.optim.SGD([*model.parameters(), logit_scale], lr=0.1)
    leafwatch.watch(logit_scale, name="logit_scale")
    with leafwatch.Monitor(model, opt) as monitor:
        (model(torch.randn(2, 4)) * logit_scale.exp()).sum().backward()
        assert monitor.check().findings == []
    assert leafwatch.audit(model, opt).findings == []


def test_a_watched_leaf_in_another_optimizer_that_steps_is_no_finding() -> None:
    model, logit_scale, opt = _clip_like()
    other = torch.optim.SGD([logit_scale], lr=0.1)  # the Monitor is not given it; it steps
    leafwatch.watch(logit_scale, name="logit_scale")
    reports = []
    with leafwatch.Monitor(model, opt) as monitor:
        for _ in range(3):
            opt.zero_grad(), other.zero_grad()
            (model(torch.randn(2, 4)) * logit_scale.exp()).sum().backward()
            reports.append(monitor.check())
            opt.step(), other.step()
    assert [r.findings for r in reports] == [[], [], []]


def _held_only_by_a_never_stepping_optimizer(audit_first: bool) -> list[leafwatch.Report]:
    """A watched `w` held only by `opt2`, which never steps and which the Monitor is not given."""
    model = nn.Linear(4, 1)
    w = torch.ones([], requires_grad=True)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    opt2 = torch.optim.SGD([w], lr=0.1)
    leafwatch.watch(w, name="w")
    if audit_first:
        (model(torch.randn(2, 4)) * w).sum().backward()
        leafwatch.audit(optimizers=opt2)  # an unrelated audit() of opt2 earlier in the process
    reports = []
    with leafwatch.Monitor(model, opt) as monitor:
        for step in range(2):
            opt.zero_grad(), opt2.zero_grad()
            (model(torch.randn(2, 4)) * w).sum().backward()
            reports.append(monitor.check())
            if not audit_first and step == 0:
                leafwatch.audit(optimizers=opt2)  # an audit() of opt2 between the Monitor's checks
            opt.step()
    return reports


@pytest.mark.parametrize("audit_first", [True, False], ids=["audit-before", "audit-between-checks"])
def test_an_audit_of_an_optimizer_changes_no_later_verdict_of_a_monitor(audit_first: bool) -> None:
    """audit() is pure: it installs no hook and leaves no process-wide trace, so an audit() given
    `opt2` does not make `opt2` count as an optimizer that trains `w` for a Monitor."""
    first, second = _held_only_by_a_never_stepping_optimizer(audit_first)
    assert first.findings == [], "held at the first gradient: it may be updated by hand"
    (finding,) = second
    assert (finding.kind, finding.name, finding.severity) == ("not_in_optimizer", "w", "error")


@pytest.mark.parametrize("monitor_first", [True, False], ids=["monitor-then-audit", "audit-then-monitor"])
def test_an_open_monitor_changes_no_verdict_of_an_audit(monitor_first: bool) -> None:
    """An audit() judges membership by the optimizers it is given, whatever a Monitor open beside it
    saw stepping: a watched `w` held only by `opt2`, which the Monitor steps and the audit is not
    given, is `not_in_optimizer` for the audit in both orders; the Monitor keeps its own verdict."""
    model = nn.Linear(4, 1)
    w = torch.ones([], requires_grad=True)
    opt, opt2 = torch.optim.SGD(model.parameters(), lr=0.1), torch.optim.SGD([w], lr=0.1)
    leafwatch.watch(w, name="w")

    def step() -> None:
        opt.zero_grad(), opt2.zero_grad()
        (model(torch.randn(2, 4)) * w).sum().backward()

    audits = []
    if not monitor_first:
        step()
        audits.append(leafwatch.audit(model, opt))
    with leafwatch.Monitor(model, opt).attach() as monitor:
        for _ in range(2):
            step()
            opt.step(), opt2.step()  # the Monitor sees opt2 step: w trains, for the Monitor
        step()
        if monitor_first:
            audits.append(leafwatch.audit(model, opt))
        assert monitor.check(opt).findings == []
    (audited,) = audits
    assert [(f.kind, f.name, f.severity) for f in audited.findings] == [("not_in_optimizer", "w", "error")]


def test_audit_subscribes_to_no_global_hook(monkeypatch: pytest.MonkeyPatch) -> None:
    """audit() observes no step: its Monitor's observer subscribes to none of leafwatch's global
    dispatchers; a Monitor's own observer subscribes to the registration, step and optimizer-built hooks,
    and its tracer, armed until the first check, to the global module forward hooks (the records', and
    the two around the top module under which the first forward runs the cut recorder)."""
    from leafwatch.observe import hooks

    subscribed: list[str] = []
    real = hooks.Dispatcher.subscribe
    monkeypatch.setattr(hooks.Dispatcher, "subscribe", lambda self, f, **how: (subscribed.append(self.name), real(self, f, **how))[1])
    model = nn.Linear(2, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loss = model(torch.randn(3, 2)).sum()
    loss.backward()
    assert leafwatch.audit(model, opt, loss=loss).findings == []
    assert subscribed == [], "audit() subscribed to a global hook"
    leafwatch.Monitor(model, opt).close()  # the recorder sees a Monitor's hooks
    assert subscribed == ["parameter registration hook", "module registration hook", "optimizer step pre-hook",
                          "optimizer built", "module forward hook", "module forward pre-hook",
                          "module forward hook (called when the forward raises too)"]


def test_a_persistent_leaf_of_the_loss_in_no_optimizer_is_an_error_named_by_its_variable() -> None:
    model, logit_scale, opt = _clip_like()
    monitor = leafwatch.Monitor(model, opt)
    reports = []
    for _ in range(3):
        opt.zero_grad()
        loss = (model(torch.randn(2, 4)) * logit_scale.exp()).sum()
        loss.backward()
        reports.append(monitor.check(loss=loss))
        opt.step()
    monitor.close()
    assert reports[0].findings == [], "one sighting is no evidence: it may be made fresh each step"
    (finding,) = reports[-1]
    _assert_outside(finding, "logit_scale", "error")  # a free tensor the user created: the gradient rule
    assert "is a leaf of the loss's graph at every step" in finding.cause
    assert "does not change between checks" in finding.cause
    assert finding.details["op"].startswith("ExpBackward")


def test_audit_with_loss_names_a_free_leaf_as_info_with_both_readings_and_carries_nothing_between_calls() -> None:
    model, scale, opt = _clip_like()
    found = []
    for _ in range(3):
        loss = (model(torch.randn(2, 4)) * scale).sum()
        loss.backward()
        found.append(leafwatch.audit(model, opt, loss=loss))
    # audit() is pure: the same state gives the same report at every call.
    assert [[(f.kind, f.name, f.severity) for f in r] for r in found] == [[("not_in_optimizer", "scale", "info")]] * 3
    finding = found[0].findings[0]
    assert not found[0], "one look cannot tell a forgotten temperature from a fresh input: info, not open"
    assert "if the same tensor is used at every step" in finding.cause
    assert "if it is made fresh each step" in finding.cause and "A Monitor, which sees the next step, decides" in finding.cause
    assert finding.details["op"].startswith("MulBackward")


def _wgan_gp_step(critic: nn.Module, real: torch.Tensor, fake: torch.Tensor) -> torch.Tensor:
    alpha = torch.rand(real.shape[0], 1)
    interpolates = (alpha * real + (1 - alpha) * fake).requires_grad_(True)
    out = critic(interpolates)
    grads = torch.autograd.grad(out.sum(), interpolates, create_graph=True)[0]
    penalty = ((grads.norm(2, dim=1) - 1) ** 2).mean()
    return critic(fake).mean() - critic(real).mean() + 10 * penalty


@pytest.mark.parametrize("kind", ["wgan_gp", "adversarial", "saliency"])
def test_leaves_made_fresh_each_step_are_never_reported(kind: str) -> None:
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    monitor = leafwatch.Monitor(model, opt)
    for _ in range(4):
        opt.zero_grad()
        x = torch.randn(3, 4)
        if kind == "wgan_gp":
            loss = _wgan_gp_step(model, x, torch.randn(3, 4).detach())
        elif kind == "adversarial":
            x_adv = x.clone().requires_grad_(True)
            grad = torch.autograd.grad(model(x_adv).sum(), x_adv)[0]
            x_adv = (x + 0.1 * grad.sign()).requires_grad_(True)
            loss = model(x_adv).pow(2).mean()
        else:
            x.requires_grad_(True)  # input-gradient saliency
            loss = model(x).sum()
        loss.backward()
        report = monitor.check(loss=loss)
        opt.step()
    monitor.close()
    assert report.findings == []


def test_the_loss_graph_is_walked_only_at_the_first_check_and_after_a_new_miss() -> None:
    model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    monitor = leafwatch.Monitor(model, opt)
    for step in range(6):
        opt.zero_grad()
        x = torch.randn(2, 4)
        loss = (model(x) if step < 4 else model[1](x)).sum()  # from step 5 on, model[0] misses
        loss.backward()
        monitor.check(loss=loss)
        opt.step()
        if step == 3:
            assert monitor.stats()["loss_graph_walks"] == 1, "a healthy step walks nothing"
    assert monitor.stats()["loss_graph_walks"] == 2, "walked again once, at the new miss"
    monitor.close()
    assert ("missing_grad", "0.weight") in monitor.history


# -- Monitor.attach(): the modules a step runs beyond the model --------------------------------------
def test_attach_names_a_free_module_the_loss_uses_and_its_fix_pastes() -> None:
    model = nn.Linear(4, 4)
    head = nn.Linear(4, 1)  # a free module the loss uses, left out of the optimizer
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    def train(steps: int) -> leafwatch.Report:
        monitor = leafwatch.Monitor(model, opt, verbose=False).attach()
        for _ in range(steps):
            opt.zero_grad()
            head(model(torch.randn(8, 4))).sum().backward()
            opt.step()
        return monitor.close()

    report = train(3)
    (f,) = report.open
    assert (f.kind, f.name, f.severity) == ("not_in_optimizer", "head", "warning")
    assert report.names("not_in_optimizer") == {"head.weight", "head.bias"}
    assert f.cause.startswith("no optimizer holds `head` (none of its tensors)")
    assert (f.reason.name, f.remedy.applicability) == ("root_outside", "code")
    code = 'opt.add_param_group({"params": head.parameters()})'
    assert f"`{code}`" in f.fix and "`head.requires_grad_(False)`" in f.fix
    exec(code, {"opt": opt, "head": head})  # pasted in the training loop's scope
    assert train(3).findings == []
    assert not any(m._forward_pre_hooks for m in (model, head))


def test_attach_on_the_generator_of_a_gan_is_quiet_about_the_critic_its_loss_runs() -> None:
    """The critic runs in the generator's step, and another optimizer steps it: no finding."""
    gen, critic = nn.Linear(2, 2), nn.Linear(2, 1)
    opt_g, opt_d = torch.optim.SGD(gen.parameters(), lr=0.1), torch.optim.SGD(critic.parameters(), lr=0.1)
    monitor = leafwatch.Monitor(gen, opt_g, verbose=False).attach()
    for _ in range(4):
        opt_g.zero_grad()
        critic(gen(torch.randn(8, 2))).sum().backward()
        opt_g.step()
        opt_d.zero_grad()
        critic(gen(torch.randn(8, 2)).detach()).sum().backward()
        opt_d.step()
    assert monitor.close().findings == []


def test_an_optimizer_stepped_as_a_loop_variable_is_named_by_its_stable_path() -> None:
    """`for opt in opts: opt.step()`: `opt` names another optimizer at each turn; the fix names
    `opts[0]`, which holds the same one wherever the user pastes it."""
    enc, dec = nn.Linear(4, 4), nn.Linear(4, 1)
    model = nn.Sequential(enc, dec)
    model.register_parameter("scale", nn.Parameter(torch.ones(1)))  # in neither optimizer
    opts = [torch.optim.SGD(enc.parameters(), lr=0.1), torch.optim.SGD(dec.parameters(), lr=0.1)]
    monitor = leafwatch.Monitor(model, opts, verbose=False).attach()
    for _ in range(3):
        for opt in opts:
            opt.zero_grad()
        (model(torch.randn(8, 4)) * model.scale).sum().backward()
        for opt in opts:
            opt.step()
    (f,) = monitor.close().open
    assert (f.kind, f.name) == ("not_in_optimizer", "scale")
    code = 'opts[0].add_param_group({"params": [model.scale]})'
    assert f"`{code}`" in f.fix and "`opt." not in f.fix
    exec(code, {"opts": opts, "model": model})
    assert any(p is model.scale for g in opts[0].param_groups for p in g["params"])


def test_a_gradient_declaration_applies_to_the_declared_modules_own_parameters_only() -> None:
    """Two roots in one Monitor (what `leafwatch run` finds): declaring how one root's gradients are
    kept (master copies) skips that root's parameters only; the other root's unused head is still
    a missing gradient, not sharded-gradient information."""
    from leafwatch.observe import sharding

    m1, m2 = nn.Linear(4, 4), nn.ModuleDict({"body": nn.Linear(4, 1), "head": nn.Linear(4, 1)})
    opt = torch.optim.SGD([*m1.parameters(), *m2.parameters()], lr=0.1)
    sharding.declare_gradients(m1, "master_copies")
    try:
        with leafwatch.Monitor(roots={"m1": m1, "m2": m2}, optimizers=opt) as monitor:
            for _ in range(2):
                opt.zero_grad()
                m2["body"](m1(torch.randn(2, 4))).sum().backward()
                for p in m1.parameters():
                    p.grad = None  # the master copies' optimizer cleared the model's grads
                report = monitor.check(opt)
    finally:
        sharding.declare_gradients(m1, None)
    assert report.names("missing_grad") == {"m2.head.weight", "m2.head.bias"}
    (sharded,) = [f for f in report.tensors("missing_grad") if f.status == "ignored"]
    assert (sharded.reason.name, sharded.details["parameters"]) == ("sharded_gradients", 2)
