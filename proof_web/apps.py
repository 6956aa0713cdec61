from django.apps import AppConfig


class ProofWebConfig(AppConfig):
    name = "proof_web"
    verbose_name = "Proof"
