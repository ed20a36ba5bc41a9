"""Fixes in the user's terms (issue 23, part 5): every snippet is valid Python built from names the
user's code has (the optimizer's variable and class, the model's variable, the module the user
assigned, the right-hand side the class wrote); a name leafwatch cannot know is said in words.

Real torch models, checked through ``audit()`` and ``Monitor``.
"""

from __future__ import annotations

import re

import pytest
import torch
from torch import nn

import leafwatch


def snippets(text: str) -> list[str]:
    """The code spans meant to be pasted: calls and assignments (not a method mention such as
    `.detach()`, nor an argument mention such as `device=`)."""
    return [s for s in re.findall(r"`([^`]+)`", text)
            if ("(" in s or "=" in s) and not s.startswith(".") and not s.endswith("=")]


def assert_valid_snippets(text: str) -> list[str]:
    found = snippets(text)
    assert found, text
    for s in found:
        assert "..." not in s, text  # a placeholder the user does not have
        compile(s, "<fix>", "exec")  # raises SyntaxError on invalid code
    return found


class WithScale(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Linear(4, 4)
        self.head = nn.Linear(4, 1)
        self.scale = nn.Parameter(torch.ones(1))  # learnable, left out of the hand-built groups

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.relu(self.body(x))) * self.scale


def _hand_built_sgd(model: WithScale) -> torch.optim.SGD:
    return torch.optim.SGD([{"params": model.body.parameters()},
                            {"params": model.head.parameters(), "lr": 0.01}], lr=0.1, momentum=0.9)


def _step(model: nn.Module, opt: torch.optim.Optimizer) -> None:
    opt.zero_grad()
    model(torch.randn(8, 4)).pow(2).mean().backward()


# -- the optimizer the user has ----------------------------------------------------------------
def test_sgd_with_hand_built_groups_gets_add_param_group_on_its_own_variable_never_adamw() -> None:
    model = WithScale()
    opt = _hand_built_sgd(model)
    with leafwatch.Monitor(model, opt, verbose=False) as monitor:
        for _ in range(2):
            _step(model, opt)
            monitored = monitor.check()
            opt.step()
    _step(model, opt)
    audited = leafwatch.audit(model, opt)
    for report in (monitored, audited):
        (finding,) = report.by_kind("not_in_optimizer")
        assert finding.name == "scale"
        assert '`opt.add_param_group({"params": [model.scale]})`' in finding.fix
        assert "your `SGD`, its groups as they are" in finding.fix
        assert "takes `opt`'s defaults (lr, weight decay, ...)" in finding.fix
        assert "AdamW" not in finding.fix and "model.parameters()" not in finding.fix
        assert finding.remedy.applicability == "code"  # pasted as it is
        assert_valid_snippets(finding.fix)


def test_the_optimizer_is_named_by_the_variable_of_the_frame_that_checks() -> None:
    model = WithScale()

    def train_one(optimizer: torch.optim.Optimizer) -> leafwatch.Report:
        _step(model, optimizer)
        return leafwatch.audit(model, optimizer)

    (finding,) = train_one(_hand_built_sgd(model)).by_kind("not_in_optimizer")
    assert '`optimizer.add_param_group({"params": [model.scale]})`' in finding.fix


def test_an_optimizer_no_variable_holds_is_your_optimizer_in_words() -> None:
    model = WithScale()
    model(torch.randn(8, 4)).pow(2).mean().backward()
    report = leafwatch.audit(model, torch.optim.SGD([*model.body.parameters(), *model.head.parameters()], lr=0.1))
    (finding,) = report.by_kind("not_in_optimizer")
    assert "add it to your optimizer: call its `add_param_group` with `{\"params\": [model.scale]}`" in finding.fix
    assert "the optimizer's defaults" in finding.fix
    assert finding.remedy.applicability == "words"  # whose `add_param_group` is for the user to say
    assert_valid_snippets(finding.fix)


def test_a_model_no_variable_holds_is_your_tensor_in_words_and_no_code_is_made_up() -> None:
    def build() -> tuple[WithScale, torch.optim.SGD]:
        m = WithScale()
        return m, torch.optim.SGD([*m.body.parameters(), *m.head.parameters()], lr=0.1)

    # Held only inside a closure: no variable, and no path from one (`pair[1]` would be a path).
    held = (lambda pair: lambda: pair)(build())
    _step(*held())
    report = leafwatch.audit(*held())
    (finding,) = report.by_kind("not_in_optimizer")
    assert "add your tensor to your optimizer" in finding.fix
    assert "[scale]" not in finding.fix and "pair" not in finding.fix  # `scale` is no variable of the user's
    assert finding.remedy.applicability == "words"
    for s in snippets(finding.fix):
        compile(s, "<fix>", "exec")


# -- the module the user assigned ---------------------------------------------------------------
class NotCalled(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.encoder = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 4))  # never called
        self.layers = nn.ModuleList([nn.Linear(4, 4) for _ in range(3)])
        self.head = nn.Linear(4, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers[:2]:  # the third layer never runs
            x = layer(x)
        return self.head(x)


def test_a_module_that_never_ran_is_named_as_the_user_assigned_it() -> None:
    model = NotCalled()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with leafwatch.Monitor(model, opt, verbose=False) as monitor:
        for _ in range(2):
            _step(model, opt)
            report = monitor.check()
            opt.step()
    by_name = {f.name: f for f in report.tensors("missing_grad")}
    assert set(by_name) == {"encoder.0.weight", "encoder.0.bias", "encoder.2.weight", "encoder.2.bias",
                            "layers.2.weight", "layers.2.bias"}
    mistakes = {f.name: f for f in report.by_kind("missing_grad")}  # one per module the user assigned
    assert set(mistakes) == {"encoder", "layers.2"}
    assert mistakes["encoder"].fix.startswith("call `encoder` in forward()")
    assert mistakes["encoder"].remedy.applicability == "words"  # where in forward() is the user's to say
    for name in ("encoder.0.weight", "encoder.2.bias"):
        # `self.encoder` is what forward() must call, not its first layer
        assert by_name[name].fix.startswith("call `encoder` in forward()"), by_name[name].fix
    # a ModuleList is never called itself: its entry is, spelled as code
    assert by_name["layers.2.weight"].fix.startswith("call `layers[2]` in forward()")
    for f in report:
        assert_valid_snippets(f.fix)


# -- one mistake, one finding -------------------------------------------------------------------
class LogScale(nn.Module):
    def __init__(s, x: torch.Tensor) -> None:  # noqa: N805 (the user's own name for self)
        super().__init__()
        s.fc = nn.Linear(4, 1)
        s.log_scale = torch.tensor(x, requires_grad=True).float()  # a float64 leaf, converted: a non-leaf

    def forward(s, x: torch.Tensor) -> torch.Tensor:  # noqa: N805
        return s.fc(x) * s.log_scale.exp()


def test_a_converted_attribute_is_one_finding_and_its_hidden_leaf_none() -> None:
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # torch's own warning about torch.tensor(tensor)
        model = LogScale(torch.tensor(0.5, dtype=torch.float64))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with leafwatch.Monitor(model, opt, verbose=False) as monitor:
        for _ in range(3):
            opt.zero_grad()
            loss = model(torch.randn(2, 4)).pow(2).mean()
            loss.backward()
            monitored = monitor.check(loss=loss)
            opt.step()
    opt.zero_grad()
    loss = model(torch.randn(2, 4)).pow(2).mean()
    loss.backward()
    audited = leafwatch.audit(model, opt, loss=loss)
    for report in (monitored, audited):
        (finding,) = report.findings  # never a second not_in_optimizer on "tensor of shape () ..."
        assert (finding.kind, finding.name) == ("orphan_tensor", "log_scale")
        # the finding names the hidden leaf that gets the gradient
        assert "unnamed temporary leaf that nothing in your code holds (shape (), float64, cpu)" in finding.cause
        # the class's own words: `s`, and the right-hand side with grad asked for by the Parameter
        assert finding.fix == "register it where it is assigned: `s.log_scale = nn.Parameter(torch.tensor(x).float())`"
        assert_valid_snippets(finding.fix)


def test_a_watched_non_leaf_gets_its_own_assignment_back_with_grad_asked_for_last() -> None:
    with pytest.warns(leafwatch.LeafwatchWarning):
        temperature = leafwatch.watch(torch.ones(1, requires_grad=True).to(torch.float64), name="temperature")
    try:
        (finding,) = leafwatch.audit().by_kind("non_leaf")
    finally:
        leafwatch.unwatch("temperature")
    assert temperature is not None
    assert ("`temperature = leafwatch.watch(torch.ones(1).to(torch.float64).requires_grad_(), "
            "name='temperature')`") in finding.fix
    assert "`dtype=torch.float64`" in finding.fix
    assert finding.remedy.applicability == "code"
    assert_valid_snippets(finding.fix)


# -- containers and attributes ------------------------------------------------------------------
def test_a_plain_list_is_registered_with_the_right_hand_side_the_class_wrote() -> None:
    class Blocks(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.blocks = [nn.Linear(4, 4), nn.Linear(4, 4)]

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            for block in self.blocks:
                x = block(x)
            return x

    (finding, *_) = leafwatch.audit(Blocks()).by_kind("orphan_tensor")
    assert finding.fix == ("register the container where it is assigned: "
                           "`self.blocks = nn.ModuleList([nn.Linear(4, 4), nn.Linear(4, 4)])`")
    assert finding.remedy.applicability == "code"
    assert_valid_snippets(finding.fix)


def test_without_the_class_source_the_fix_uses_the_attribute_itself() -> None:
    scope: dict = {"nn": nn, "torch": torch}
    exec("class NoSource(nn.Module):\n"
         "    def __init__(self):\n"
         "        super().__init__()\n"
         "        self.gains = [nn.Parameter(torch.ones(3))]\n"
         "        self.temperature = torch.ones(1, requires_grad=True)\n", scope)
    report = leafwatch.audit(scope["NoSource"]())
    fixes = {f.name: f.fix for f in report.by_kind("orphan_tensor")}
    assert "`self.gains = nn.ParameterList(self.gains)`" in fixes["gains[0]"]
    assert "`self.temperature = nn.Parameter(self.temperature.detach())`" in fixes["temperature"]
    for fix in fixes.values():
        assert_valid_snippets(fix)


# -- a replaced layer ---------------------------------------------------------------------------
def test_a_replaced_layer_is_given_to_the_users_optimizer_by_its_variable() -> None:
    model = WithScale()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model.head = nn.Linear(4, 1)  # replaced after the optimizer was built
    _step(model, opt)
    report = leafwatch.audit(model, opt)
    stale = report.tensors("stale_param")
    assert {f.name for f in stale} == {"head.weight", "head.bias"}
    assert [f.group for f in report.by_kind("stale_param")] == ["optimizers[0]"]
    for f in stale:
        assert f'`opt.add_param_group({{"params": [model.{f.name}]}})`' in f.fix
        assert "rebuild `opt` after the last change to the model, with the same class and groups" in f.fix
        assert "AdamW" not in f.fix
        assert_valid_snippets(f.fix)


# -- devices, dtypes, the loop ------------------------------------------------------------------
def test_a_parameter_left_behind_is_moved_with_the_users_model_variable() -> None:
    # The meta device stands in for CUDA (tests/core/test_cuda.py runs the same on a GPU).
    model = nn.Sequential(nn.Linear(3, 3), nn.Linear(3, 1)).to("meta")
    model.scale = nn.Parameter(torch.ones(1))  # registered after the model was moved: stays on the CPU
    report = leafwatch.audit(model, torch.optim.SGD(model.parameters(), lr=0.1))
    (finding,) = report.by_kind("device_mismatch")
    assert finding.name == "scale"
    assert "`model.to('meta')`" in finding.fix
    assert_valid_snippets(finding.fix)


def test_gradients_cleared_before_the_step_name_the_users_optimizer() -> None:
    model = WithScale()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    monitor = leafwatch.Monitor(model, opt, verbose=False).attach()
    for _ in range(3):
        model(torch.randn(8, 4)).pow(2).mean().backward()
        opt.zero_grad()  # the bug: the gradients are gone before the step
        opt.step()
    (finding,) = monitor.close().by_kind("grad_cleared")
    assert finding.fix == "call `opt.zero_grad()` before the forward pass (or right after `opt.step()`)"
    assert finding.remedy.applicability == "code"
    assert_valid_snippets(finding.fix)


def test_the_assignment_that_registers_already_is_passed_over_for_the_one_that_does_not() -> None:
    class Branches(nn.Module):
        def __init__(self, bug: bool = True) -> None:
            super().__init__()
            self.fc = nn.Linear(2, 1)
            if not bug:
                self.temperature = nn.Parameter(torch.ones(1))
            else:
                self.temperature = torch.ones(1, requires_grad=True).to(torch.float64)

    (finding,) = leafwatch.audit(Branches()).by_kind("orphan_tensor")
    assert finding.fix == ("register it where it is assigned: "
                           "`self.temperature = nn.Parameter(torch.ones(1).to(torch.float64))`")


def test_a_module_left_out_as_a_whole_is_given_as_the_module_the_user_assigned() -> None:
    class EncoderLeftOut(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.encoder = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 4))
            self.head = nn.Linear(4, 1)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.head(self.encoder(x))

    model = EncoderLeftOut()
    opt = torch.optim.SGD(model.head.parameters(), lr=0.1)
    _step(model, opt)
    report = leafwatch.audit(model, opt)
    assert report.names("not_in_optimizer") == {"encoder.0.weight", "encoder.0.bias", "encoder.2.weight",
                                                "encoder.2.bias"}
    for f in report.by_kind("not_in_optimizer"):
        # `encoder`, as assigned, not `encoder.0` nor one tensor at a time
        assert '`opt.add_param_group({"params": model.encoder.parameters()})`' in f.fix
        assert_valid_snippets(f.fix)


def test_looking_up_the_users_names_keeps_none_of_the_users_tensors_alive() -> None:
    """The fixes read the user's frames for names; a tensor of a function that returned must die
    with it, without waiting for the garbage collector (no frame tied in a cycle)."""
    import gc
    import weakref

    def train_once() -> weakref.ReferenceType:
        model = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 1))
        opt = torch.optim.SGD(model[0].parameters(), lr=0.1)  # model[1] left out: its fix names `opt`
        activation = leafwatch.watch(model[0](torch.ones(1, 2)), name="activation_kept_by_nobody", expect_leaf=False)
        model[1](activation).sum().backward()
        report = leafwatch.audit(model, opt)
        assert "`opt`" in report.by_kind("not_in_optimizer")[0].fix
        return weakref.ref(activation)

    # torch's first optimizer imports its compile machinery, and that import's frames, tied in a cycle,
    # hold the frames below it (train_once's too) until the collector runs: done once beforehand, so the
    # test sees leafwatch's references only (run alone, it failed on torch's).
    torch.optim.SGD([nn.Parameter(torch.ones(1))], lr=0.1)
    gc.collect()
    gc.disable()
    try:
        ref = train_once()
        assert ref() is None, [type(r).__name__ for r in gc.get_referrers(ref())]
    finally:
        gc.enable()
        leafwatch.unwatch_all()


def test_a_path_to_an_object_goes_through_public_names_and_indexes_only() -> None:
    """The resolver's paths are code the user can paste: public attributes, list and dict items,
    a Sequential's index; never a private attribute."""
    from types import SimpleNamespace

    from leafwatch.observe.discovery import paths_to

    head, hidden = nn.Linear(2, 1), nn.Linear(2, 1)
    opt = torch.optim.SGD(head.parameters(), lr=0.1)
    net = SimpleNamespace(module_=nn.Sequential(nn.Linear(2, 2), head), optimizer_=opt, heads={"a": hidden})
    net._private = SimpleNamespace(only=nn.Linear(2, 2))
    found = paths_to([head, opt, hidden, net._private.only], {"net": net})
    assert found == {id(head): "net.module_[1]", id(opt): "net.optimizer_", id(hidden): "net.heads['a']"}


class EntriesCalledDirectly(nn.Module):
    """A Sequential whose entries forward() calls one by one (the Sequential itself never runs), the last
    entry of its ModuleList never."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(4, 4), nn.ModuleList([nn.Linear(4, 4) for _ in range(3)]))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.body[0](x)
        for block in list(self.body[1])[:2]:
            x = block(x)
        return x


def test_the_module_to_call_stays_the_same_at_every_check() -> None:
    # After its first check leafwatch watches only the modules around the missing tensors, so a later
    # check sees less of the forward: the call worked out when the whole step was watched stays.
    model = EntriesCalledDirectly()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    fixes = []
    with leafwatch.Monitor(model, opt, verbose=False) as monitor:
        for _ in range(4):
            _step(model, opt)
            report = monitor.check()
            opt.step()
            (finding,) = report.by_kind("missing_grad")
            assert (finding.name, finding.reason.observed) == ("body.1.2", "never_ran")
            fixes.append(finding.fix)
    assert fixes[0].startswith("call `body[1][2]` in forward()"), fixes[0]
    assert set(fixes) == {fixes[0]}, fixes
    assert (finding.status, finding.steps_seen) == ("open", 4)
