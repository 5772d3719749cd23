"""Reading back what was played: exact replay of a transcript, the terminal viewer, the HTML
report of an episode or a run, and the reports built from many episodes (the negotiation
report, the mechanism comparison). It sits above ``market.run``, whose episode driver replay
re-runs and whose tables the reports read; ``market.record`` below both holds the transcript
format, its writer and reader."""
