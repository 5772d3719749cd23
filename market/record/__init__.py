"""Transcripts: the schema, writer and reader, exact replay, the terminal viewer and the HTML
report."""
