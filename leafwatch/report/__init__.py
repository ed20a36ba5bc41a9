"""What was found, as values and text: findings, their history, the grouping into mistakes,
the record format the sinks and the tab share, the console and markdown text. Imports no torch."""
