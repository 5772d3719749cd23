"""The market as a service: an OpenEnv environment, its server and its typed client
(``market.serve.openenv_env``, ``market.serve.openenv_app``, ``market.serve.openenv_client``;
they need ``pip install 'gpumarket[serve]'``)."""
