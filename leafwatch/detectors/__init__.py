"""The detectors: one module per concern, each turning a check's evidence into verdicts.

A detector reads what the hooks, the structure and the step observed (the evidence modules:
:mod:`leafwatch.observe.structure`, :mod:`leafwatch.observe.inventory`, :mod:`leafwatch.observe.tracing`,
:mod:`leafwatch.observe.cuts`, :mod:`leafwatch.observe.changes`, :mod:`leafwatch.observe.values`) and the findings so
far through a read-only :class:`~leafwatch.report.history.FindingsView`, and returns
:class:`~leafwatch.report.verdicts.Verdict` values. It never writes the history: the check's
:class:`~leafwatch.detectors.pipeline.Pipeline` applies the verdicts once the detector has returned, so a
detector that raises costs only its own verdicts. The list of detectors and their order exist
once, in :data:`leafwatch.detectors.registry.DETECTORS`; every front-end (``audit()``, ``Monitor``,
``leafwatch run``, the Lightning, Hugging Face and pytest front-ends) runs that one list.

==================  ============================================================================
``structure``       a reading of the model and its optimizers: not_in_optimizer, frozen_in_optimizer,
                    stale optimizers (stale_param), orphan tensors, device/dtype mismatches
``gradients``       streaks of missing gradients: missing_grad (with the observed cause), intermittent,
                    stalled; with ``held``, LayerDrop and EMA-target suspicions held until the
                    evidence decides
``watched``         tensors flagged with ``watch()`` / ``tensors=``: non_leaf, no gradient, in no optimizer
``outside``         trainable leaves of the loss's graph that no optimizer holds
``membership``      not_in_optimizer (its words), held and decided by the gradient rule (teachers, EMA
                    copies, optimizers that step late)
``values``          NaN/Inf gradients (nonfinite_grad) and, with ``dead``, exactly-zero ones (dead_grad)
``loop``            the training loop: gradients cleared before the step (grad_cleared), a learning
                    rate stuck at 0 and steps always skipped (no_update)
``causes``          why a tensor missed its gradient, read from the tracer's records
``ranks``           the merge across ranks (``gatherer`` runs it after each check), sharded gradients
``constructors``    make(), and the texts several detectors' builders share
``pipeline``        runs the Checker's parts (``checker``) in order, each guarded
==================  ============================================================================

A new detector is a new module here returning verdicts, and one entry in ``registry.DETECTORS``.
"""
