"""Data rights of a client: access to their data (the JSON download) and erasure."""
