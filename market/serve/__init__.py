"""The market as a service (needs ``pip install 'gpumarket[serve]'``): an OpenEnv environment, its
server and its typed client (``openenv_env``, ``openenv_app``, ``openenv_client``), and served
matches with remote seats (``matches``, ``match_app``, ``agent_app``)."""
