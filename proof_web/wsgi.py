import os

from django.core.wsgi import get_wsgi_application

from proof_web import heap

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "proof_web.settings")
application = get_wsgi_application()
heap.settle()  # after the application is loaded: proof_web/heap.py
