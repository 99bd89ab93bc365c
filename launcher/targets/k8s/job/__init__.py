"""What runs in a Kubernetes job's pods: the pod runner (``podrun.py``, with ``podstacks.py``: each pod's
ranks' stacks served), carried in the pod's env by
``k8s/objects/runner.py`` into images without ddpjob. At module top it imports only the standard library
(the shared in-job modules it loads by name, ``_shared``); tests/foundation/test_found_wing.py
holds it. Nothing is imported here."""
