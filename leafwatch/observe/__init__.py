"""What happens in a training step, recorded: every torch hook leafwatch installs and what it saw.

The structure of the model and its optimizers (names, aliases, who holds what, the counted global
registration and step hooks), the forward records and the cuts, gradient arrival, value
snapshots, the evidence that tells intent from accident, and what distributed training hides.
Nothing here judges: it imports none of ``detectors/``, ``report/``, ``sinks/`` or
``integrations/`` (``tests/core/test_architecture.py``).
"""
