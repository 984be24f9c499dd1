"""Page types a browser agent meets, with descriptions and example screen text.

The examples are what OCR typically reads off such a page (written by hand from common
web patterns, in English with a few German, French and Spanish lines; none is copied from
the test fixtures). The engine fits its prototype head on them, so the
:class:`~clef_agents.vision.ScreenshotClassifier` works without a training run.
"""

from __future__ import annotations

from typing import Any

PAGE_TYPES: dict[str, dict[str, Any]] = {
    "login": {
        "description": "a sign-in / log-in form asking for username or email and password",
        "examples": [
            "Sign in\nEmail\nPassword\nSign in\nForgot password?\nDon't have an account? Sign up",
            "Log in to your account\nUsername\nPassword\nRemember me\nLog in",
            "Welcome back\nPlease enter your details\nEmail\nPassword\nLogin\nContinue with Google",
            "Member login\nUser ID\nPassword\nSubmit\nNeed help signing in?",
            "Anmelden\nE-Mail\nPasswort\nAngemeldet bleiben\nAnmelden\nPasswort vergessen?",
            "Connexion\nIdentifiant\nMot de passe\nSe connecter\nMot de passe oublié ?",
            "Iniciar sesión\nCorreo electrónico\nContraseña\nEntrar",
            "Sign in with SSO\nWork email\nNext\nUse a password instead",
            "Sign in to your account\nEmail\nPassword\nSign in\nForgot your password?\n"
            "Create an account",
            "Log in\nPhone, email or username\nPassword\nLog in\nForgot password?\nSign up",
        ],
    },
    "registration": {
        "description": "a sign-up form to create a new account",
        "examples": [
            "Create an account\nFirst name\nLast name\nEmail\nPassword\nConfirm password\nSign up",
            "Sign up for free\nUsername\nEmail address\nCreate password\nI agree to the Terms\n"
            "Create account\nAlready have an account? Log in",
            "Join now\nGet started in minutes\nFull name\nEmail\nPassword\nRegister",
            "Start your free trial\nWork email\nCompany name\nCreate account\n"
            "No credit card required",
            "Registrieren\nVorname\nNachname\nE-Mail\nPasswort wiederholen\nKonto erstellen",
            "Inscription\nNom\nPrénom\nE-mail\nCréer mon compte",
            "Crear cuenta\nNombre\nCorreo\nContraseña\nRegistrarse",
        ],
    },
    "password_reset": {
        "description": "a forgot-password or reset-password page",
        "examples": [
            "Forgot password?\nEnter your email and we'll send you a reset link\nEmail\nSend link",
            "Reset your password\nNew password\nConfirm new password\nReset password",
            "Password recovery\nWe will email you a link to reset your password\nSubmit\n"
            "Back to login",
            "Trouble signing in?\nEnter your username to receive a password reset email",
            "Passwort zurücksetzen\nNeues Passwort\nPasswort bestätigen\nSpeichern",
            "Mot de passe oublié\nRecevoir un lien de réinitialisation",
            "Check your email\nWe sent a password reset link to your inbox\nResend email",
        ],
    },
    "error_page": {
        "description": "an HTTP error page: 404 not found, 403 forbidden, 500 server error, 503",
        "examples": [
            "404\nPage not found\nThe page you are looking for doesn't exist\nGo home",
            "500 Internal Server Error\nSomething went wrong. Please try again later",
            "403 Forbidden\nYou don't have permission to access this resource",
            "502 Bad Gateway\nnginx",
            "503 Service Unavailable\nThe server is temporarily down for maintenance",
            "Oops! This page could not be found\nError 404\nBack to homepage",
            "Seite nicht gefunden\nFehler 404\nZur Startseite",
            "Error 500\nAn unexpected error occurred\nRequest ID",
        ],
    },
    "captcha": {
        "description": "a captcha or bot check asking to prove you are human",
        "examples": [
            "I'm not a robot\nreCAPTCHA\nPrivacy - Terms",
            "Verify you are human by completing the action below\nChecking your browser",
            "Select all images with bicycles\nVerify\nSkip",
            "Just a moment...\nChecking if the site connection is secure\nRay ID",
            "Please type the characters you see in the image\nSubmit",
            "Press and hold to confirm you are a human (and not a bot)",
            "Unusual traffic detected from your computer network\nSolve the puzzle to continue",
            "Bitte bestätigen Sie, dass Sie kein Roboter sind",
        ],
    },
    "cookie_consent": {
        "description": "a cookie consent banner or privacy dialog asking to accept cookies",
        "examples": [
            "We use cookies\nWe use cookies to improve your experience and for analytics\n"
            "Accept all\nReject all\nManage preferences",
            "This site uses cookies. By continuing you agree to our cookie policy\nOK\nLearn more",
            "Your privacy matters\nWe and our partners store and access information on your "
            "device\nAgree\nCookie settings",
            "Cookie preferences\nStrictly necessary\nPerformance\nTargeting\nSave settings\n"
            "Accept cookies",
            "Cookie-Einstellungen\nWir verwenden Cookies\nAlle akzeptieren\nNur notwendige",
            "Nous utilisons des cookies\nTout accepter\nParamétrer",
            "Utilizamos cookies\nAceptar todas\nConfigurar",
        ],
    },
    "search_results": {
        "description": "a list of search results for a query typed in a search box",
        "examples": [
            "Search\nAbout 3,200,000 results\nresult title\nwww.example.com › page\nsnippet text\n"
            "Next page",
            'Results for "laptop stand"\nShowing 1-10 of 482 results\nSort by relevance',
            "Search results\nYour search returned 27 matches\nFilter results",
            "Did you mean\nPeople also ask\nRelated searches\nImages\nNews\nVideos",
            "Suchergebnisse\nUngefähr 1.200 Ergebnisse\nWeiter",
            "No results found for your query. Try different keywords",
        ],
    },
    "product_listing": {
        "description": "a shop category page with a grid of many products and prices",
        "examples": [
            "Women's jackets\n120 items\nFilter\nSort by: Price low to high\nProduct name $49.99\n"
            "Product name $59.99\nProduct name $39.00",
            "Shop all\nNew arrivals\nBest sellers\nAdd to cart\n$19.99\nAdd to cart\n$24.99",
            "Laptops\nShowing 24 of 310 products\nBrand\nPrice\nRating\n★★★★☆\n£899\n£1,099",
            "Category: Kitchen\nQuick view\n€29,95\nQuick view\n€14,50\nLoad more products",
            "Herren Schuhe\n48 Artikel\nSortieren\n59,99 €\n79,99 €",
        ],
    },
    "product_detail": {
        "description": "a single product page with photos, price, size options and add to cart",
        "examples": [
            "Classic Cotton T-Shirt\n$25.00\nSelect size\nS M L XL\nAdd to cart\n"
            "Product description\nFree shipping and returns",
            "Wireless earbuds\n★★★★★ 2,431 ratings\n$79.99\nIn stock\nQuantity 1\nAdd to basket\n"
            "Buy now",
            "Product details\nSpecifications\nMaterial\nDimensions\nCustomer reviews\nAdd to bag",
            "In den Warenkorb\nArtikelbeschreibung\nLieferzeit 2-3 Tage\n49,90 €",
            "Ajouter au panier\nDescription du produit\n39,00 €\nEn stock",
        ],
    },
    "cart_checkout": {
        "description": "a shopping cart or checkout page with order summary, total and payment",
        "examples": [
            "Shopping cart\nItem\nQuantity\nPrice\nSubtotal $58.00\nProceed to checkout",
            "Checkout\nShipping address\nPayment method\nCard number\nExpiry date\nPlace order\n"
            "Order summary\nTotal",
            "Your bag (2 items)\nRemove\nEstimated shipping\nOrder total\nCheckout",
            "Review your order\nDelivery options\nBilling address\nPay now",
            "Warenkorb\nZwischensumme\nZur Kasse\nGesamtsumme",
            "Panier\nSous-total\nValider la commande\nTotal TTC",
        ],
    },
    "article": {
        "description": "a news article or blog post: headline, author, date and prose",
        "examples": [
            "Headline of the story\nBy Jane Smith · May 2, 2024 · 6 min read\nThe first paragraph "
            "of the article explains what happened and why it matters to readers.",
            "Blog\nPosted on March 14 by admin\nIn this post I want to share what we learned "
            "while building our new feature.\nComments\nShare",
            "Opinion\nWhy we need better public transport\nThe city has grown quickly and the "
            "buses have not kept up with it.",
            "Tutorial: getting started with gardening\nStep 1\nChoose a sunny spot\nRead more",
            "Von Max Müller · 3. Mai 2024\nDer Artikel beschreibt die Entwicklung der Stadt.",
            "Publié le 12 avril par la rédaction\nLa suite de l'article raconte notre voyage.",
        ],
    },
    "dashboard": {
        "description": "an app dashboard with a side menu, metrics, KPIs and charts",
        "examples": [
            "Dashboard\nOverview\nTotal revenue $12,430\n+8% from last month\nActive users 1,204\n"
            "Analytics\nReports\nSettings",
            "Welcome back\nYour stats this week\nSessions\nConversion rate 3.2%\nView report",
            "Home\nProjects\nTeam\nUsage this month\nStorage 72% used\nUpgrade plan",
            "Monitoring\nCPU\nMemory\nUptime 99.98%\nIncidents\nLatency p95",
            "Übersicht\nUmsatz\nBesucher heute\nBerichte",
        ],
    },
    "data_table": {
        "description": "a data table or spreadsheet with column headers and many rows of values",
        "examples": [
            "ID\nName\nEmail\nStatus\nCreated\n1\nJohn Doe\njohn@example.com\nActive\n2024-01-03\n"
            "2\nMary Jones\nmary@example.com\nInactive",
            "Order #\nDate\nCustomer\nTotal\nStatus\n10231\n03/04\nSmith\n$120.00\nShipped",
            "Rows per page 25\n1-25 of 1,340\nExport CSV\nColumn\nValue",
            "year\nregion\nsales\nunits\n2021\nNorth\n10,200\n340\n2022\nSouth\n9,870\n310",
            "Name\nAbteilung\nStandort\nEintrittsdatum",
        ],
    },
}
"""Page type → ``{"description", "examples"}`` (a ready-made ``Choice`` criteria mapping)."""
