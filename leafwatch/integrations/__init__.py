"""Front-ends: thin adapters that map a framework's events onto a :class:`~leafwatch.Monitor`.

- ``lightning``: the ``LeafWatch`` callback for PyTorch Lightning (both namespaces);
- ``runner``: ``leafwatch run``, global optimizer/module hooks around an unmodified script;
- ``distributed``, ``tensorboard``: re-exports of :mod:`leafwatch.observe.sharding` and
  :mod:`leafwatch.sinks.tensorboard` at their earlier import paths (the core never imports this package).

A new front-end goes here; it builds a ``Monitor`` and calls its public methods only.
"""
