"""Front-ends and sinks: thin adapters that map a framework's events onto a :class:`~leafwatch.Monitor`.

- ``lightning``: the ``LeafWatch`` callback for PyTorch Lightning (both namespaces);
- ``runner``: ``leafwatch run``, global optimizer/module hooks around an unmodified script;
- ``distributed``: findings merged across ranks, gradient views of DDP/FSDP;
- ``tensorboard``: the TensorBoard sink (scalars, markdown table, layout, the tab's records).

A new front-end goes here; it builds a ``Monitor`` and calls its public methods only.
"""
