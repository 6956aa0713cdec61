from django.urls import path

from billing.api import views

urlpatterns = [
    path("stripe/webhook/", views.stripe_webhook, name="billing-stripe-webhook"),
]
