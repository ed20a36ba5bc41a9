"""Causes that say what happened: an ignored output is not a cut, a cut is named where it is,
a rewrap is named, an unfrozen parameter is told from one left out, and the "being traced"
placeholder never stays."""

from __future__ import annotations

import inspect

import torch
from torch import nn

import leafwatch
from leafwatch.observe.structure import REQUIRES_GRAD_EVERY


def _monitor_step(model: nn.Module, opt: torch.optim.Optimizer | None = None) -> leafwatch.Report:
    opt = opt or torch.optim.SGD(model.parameters(), lr=0.1)
    with leafwatch.Monitor(model, opt) as monitor:
        model(torch.randn(4, 3)).sum().backward()
        return monitor.check()


class WithPooler(nn.Module):
    """A pooler whose output the loss never reads (the head uses the encoder's output)."""

    def __init__(self) -> None:
        super().__init__()
        self.encoder = nn.Linear(3, 3)
        self.pooler = nn.Linear(3, 3)
        self.head = nn.Linear(3, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden = self.encoder(x)
        self.pooler(hidden)  # computed and ignored
        return self.head(hidden)


def test_an_output_nothing_uses_is_told_from_a_cut() -> None:
    report = _monitor_step(WithPooler())
    assert report.names() == {"pooler.weight", "pooler.bias"}
    assert [f.name for f in report] == ["pooler"]  # one module computed and ignored: one mistake
    for f in report.tensors():
        assert (f.kind, f.reason.name) == ("missing_grad", "unused_output")
        # The recorder watched the forward and saw no cut: said as seen, with no guess stated as fact.
        assert "No op that cuts a graph" in f.cause and "Most likely" not in f.cause
        assert "nothing in the loss uses it" in f.cause and "between `pooler` and `head`" in f.cause
        assert "group" not in f.details
        assert "use `pooler`'s output in the loss, or remove `pooler`" in f.fix
        assert "ignore=" in f.fix
        assert "remove the `.detach()`" not in f.fix


class ListRewrap(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(3, 3)
        self.b = nn.Linear(3, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(torch.tensor(self.a(x).tolist()))


def _line_of(function, text: str) -> str:
    """``test_causes.py:N``: the line of ``function``'s source that holds ``text``."""
    lines, first = inspect.getsourcelines(function)
    return f"test_causes.py:{first + next(i for i, line in enumerate(lines) if text in line)}"


def test_a_rewrap_of_an_output_is_named_at_its_line() -> None:
    report = _monitor_step(ListRewrap())
    assert report.names() == {"a.weight", "a.bias"}
    at = _line_of(ListRewrap.forward, ".tolist()")
    for f in report:
        assert f.reason.name == "rewrapped"
        assert f"cut by `.tolist()` at {at} (in `ListRewrap.forward`)" in f.cause
        assert f.details["group"] == f".tolist() at {at}"
        assert f"keep the values a tensor at {at}" in f.fix
        assert "same shape" not in f.cause  # a shape is no evidence


class Scaler(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.ones(3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.tensor(self.scale.tolist())


def test_a_parameter_used_through_a_rewrap_names_the_rewrap() -> None:
    model = nn.Sequential(nn.Linear(3, 3), Scaler(), nn.Linear(3, 1))
    report = _monitor_step(model)
    (finding,) = report
    assert (finding.kind, finding.name, finding.reason.name) == ("missing_grad", "1.scale", "rewrapped")
    at = _line_of(Scaler.forward, ".tolist()")
    assert f"cut by `.tolist()` at {at} (in `Scaler.forward`)" in finding.cause
    assert finding.details["group"] == f".tolist() at {at}"


def test_a_parameter_unfrozen_after_the_optimizer_was_built_is_told_from_one_left_out() -> None:
    model = nn.Sequential(nn.Linear(3, 3), nn.Linear(3, 1))
    model[0].requires_grad_(False)  # a frozen backbone
    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.1)
    monitor = leafwatch.Monitor(model, opt)
    for step in range(1, 2 * REQUIRES_GRAD_EVERY + 2):
        if step == 3:
            model[0].requires_grad_(True)  # unfrozen, never added to the optimizer
        opt.zero_grad()
        model(torch.randn(4, 3)).sum().backward()
        report = monitor.check()
        opt.step()
    monitor.close()
    assert report.names("not_in_optimizer") == {"0.weight", "0.bias"}
    assert [f.name for f in report.by_kind("not_in_optimizer")] == ["0"]  # one layer unfrozen: one mistake
    for f in report.tensors("not_in_optimizer"):
        assert f.reason.name == "unfrozen_after"
        assert "unfrozen after it" in f.cause
        # the user's optimizer and the user's tensor, valid code (no Lightning helper outside Lightning)
        assert f'`opt.add_param_group({{"params": [model[0].{f.name.split(".")[-1]}]}})`' in f.fix
        assert "your `SGD`" in f.fix
    left_out = leafwatch.audit(model, opt).by_kind("not_in_optimizer")[0]
    assert left_out.reason.name == "left_out"
    assert "left out when the optimizer's parameter list was built" in left_out.cause


class SkipsOnce(nn.Module):
    """`a` is left out at step 3 only (when its hooks are no longer armed)."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(3, 3)
        self.b = nn.Linear(3, 1)
        self.calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        return self.b(x if self.calls == 3 else self.a(x))


def test_the_being_traced_placeholder_is_replaced_when_the_gradient_comes_back() -> None:
    model = SkipsOnce()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    causes = []
    with leafwatch.Monitor(model, opt) as monitor:
        for _ in range(4):
            opt.zero_grad(set_to_none=True)
            model(torch.randn(4, 3)).sum().backward()
            report = monitor.check()
            causes.append([f.cause for f in report.by_kind("missing_grad")])
            opt.step()
    assert any("being traced" in c for c in causes[2]), "step 3: traced, the cause comes next"
    final = monitor.history[("missing_grad", "a.weight")]
    assert "being traced" not in final.cause
    assert "got one again at step 4" in final.cause
    assert final.status == "intermittent"
    assert all("being traced" not in f.cause for f in report)


class _StraightThrough(torch.autograd.Function):
    """A custom Function that runs a module in its forward and returns a gradient for its input only."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, fn: nn.Module) -> torch.Tensor:  # type: ignore[override]
        return fn(x)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):  # type: ignore[override]
        return grad, None


class _Linear(torch.autograd.Function):
    """A custom Function given its weights: its backward returns their gradients."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        ctx.save_for_backward(x, weight)
        return x @ weight.t()

    @staticmethod
    def backward(ctx, grad: torch.Tensor):  # type: ignore[override]
        x, weight = ctx.saved_tensors
        return grad @ weight, grad.t() @ x


class InsideFunction(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inner = nn.Linear(3, 3)
        self.weight = nn.Parameter(torch.randn(3, 3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = _StraightThrough.apply(x, self.inner)  # applied here
        return _Linear.apply(h, self.weight)


def test_a_module_run_inside_a_custom_function_not_given_its_parameters_names_that_function() -> None:
    report = _monitor_step(InsideFunction())
    (f,) = report.findings  # `weight`, given to `_Linear.apply`, trains: no finding
    assert report.names() == {"inner.weight", "inner.bias"}
    assert (f.kind, f.reason.name) == ("missing_grad", "inside_function")
    at = _line_of(InsideFunction.forward, "# applied here")
    assert f.cause == (f"`inner` ran only inside the forward of the custom autograd.Function `_StraightThrough` "
                       f"(applied at {at}). torch runs a Function's forward without autograd and sends gradients "
                       "back only through its backward, to the tensors given to `_StraightThrough.apply`: none of "
                       "`inner.{bias,weight}` was among them, so no gradient reaches them.")
    assert f.fix.startswith("give `inner`'s parameters to `_StraightThrough.apply` as inputs: its backward returns "
                            "gradients only for its inputs")


class _RecomputedGrad(torch.autograd.Function):
    """A custom Function that runs a module in its forward under ``torch.enable_grad()``, returns the result
    detached and computes the input's gradient itself in its backward (a backward through the graph it kept,
    ``inputs=`` the input only): the module's parameters, not given to ``apply``, get none."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, fn: nn.Module) -> torch.Tensor:  # type: ignore[override]
        with torch.enable_grad():
            inner_x = x.detach().requires_grad_()
            out = fn(inner_x).tanh()
        ctx.save_for_backward(inner_x, out)
        return out.detach()

    @staticmethod
    def backward(ctx, grad: torch.Tensor):  # type: ignore[override]
        inner_x, out = ctx.saved_tensors
        torch.autograd.backward(out, grad, inputs=[inner_x])
        return inner_x.grad, None


class InsideGradOnFunction(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inner = nn.Linear(3, 3)
        self.head = nn.Linear(3, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(_RecomputedGrad.apply(x, self.inner))  # applied here


def _assert_inside_grad_on_function(f, at: str) -> None:
    assert (f.kind, f.reason.name) == ("missing_grad", "inside_function")
    assert (f.name, f.details["location"]) == ("inner", f"inside `_RecomputedGrad` at {at}")
    assert f.cause == (f"`inner` ran only inside the forward of the custom autograd.Function `_RecomputedGrad` "
                       f"(applied at {at}). It ran there under `torch.enable_grad()`, but the graph it built ends "
                       "inside that forward: what `_RecomputedGrad` returns carries only its own backward node, and "
                       "torch sends gradients back only through `_RecomputedGrad`'s backward, to the tensors given to "
                       "`_RecomputedGrad.apply`: none of `inner.{bias,weight}` was among them, so no gradient reaches "
                       "them.")
    assert "does not use" not in f.cause and "`.detach()` at" not in f.cause  # not a cut of the user's to remove
    assert f.fix.startswith("give `inner`'s parameters to `_RecomputedGrad.apply` as inputs: its backward returns "
                            "gradients only for its inputs")


def test_a_module_run_inside_a_custom_function_under_enable_grad_names_that_function() -> None:
    model = InsideGradOnFunction()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with leafwatch.Monitor(model, opt, verbose=False) as monitor:
        for _ in range(3):  # the first step instrumented (the Function's `.detach()` seen), the later ones not
            opt.zero_grad()
            model(torch.randn(4, 3)).sum().backward()
            report = monitor.check()
            opt.step()
            (f,) = report.findings  # `head` trains
            assert report.names() == {"inner.weight", "inner.bias"}
            _assert_inside_grad_on_function(f, _line_of(InsideGradOnFunction.forward, "# applied here"))


def test_a_custom_function_under_enable_grad_applied_in_the_loop_is_named_too() -> None:
    """Applied outside any module's forward (no op recorded): the hooks' own records name it."""
    model = nn.ModuleDict({"inner": nn.Linear(3, 3), "head": nn.Linear(3, 1)})
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with leafwatch.Monitor(model, opt, verbose=False) as monitor:
        for _ in range(2):
            opt.zero_grad()
            model["head"](_RecomputedGrad.apply(torch.randn(4, 3), model["inner"])).sum().backward()  # applied here
            report = monitor.check()
            opt.step()
    (f,) = report.findings
    at = _line_of(test_a_custom_function_under_enable_grad_applied_in_the_loop_is_named_too, "# applied here")
    _assert_inside_grad_on_function(f, at)
