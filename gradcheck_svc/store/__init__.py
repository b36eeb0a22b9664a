"""Where results are kept, below every other part of the service that writes them: records.py (the run and
unit layout, atomic writes, content and code-version keys), location.py (a local directory or an object
store URL), schema.py (what a whole record is). The batch runner and merge, the finite-difference shards
(verify/fd_shards.py) and the server's code version all read it; it reads nothing above errors.py,
extras.py and text.py."""
