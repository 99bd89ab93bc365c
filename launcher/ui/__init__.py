"""``ddpjob ui``: a local dashboard of the jobs in the registry, in a browser.

Owns the web application (``app``: Starlette routes that call the service), its pages as HTML
(``pages``) and curves as inline SVG (``svg``), the script and style it serves itself (``assets``:
nothing is fetched from elsewhere), its guard (``guard``: the random token, the Host header check
against DNS rebinding) and the server (``serve``: uvicorn on a socket it binds). May import
``launcher.core``, ``launcher.spec``, ``launcher.targets`` (the base types and names) and
``launcher.service``; never the command line (``launcher.cli``), which imports it inside the ``ui``
command only, so the CLI's start-up loads no web framework. Starlette and uvicorn come with the
``ddpjob[ui]`` extra.
"""
