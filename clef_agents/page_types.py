"""Page types a browser agent meets, with descriptions and example screen text.

The examples are what OCR typically reads off such a page, line by line (written by hand
from common web patterns, in English with a few German, French and Spanish lines; none is
copied from the test fixtures or from the template pages the benchmark measures; some
follow the patterns of the ``tune`` template pages, never of the ``heldout`` ones). The
engine fits its prototype head on them, so the
:class:`~clef_agents.vision.ScreenshotClassifier` works without a training run.

Neighbouring types are taught apart on purpose: a sign-in form carries a "Forgot
password?" link and a sign-up link (so neither pulls it to ``password_reset`` or
``registration``); a blog's front page lists several posts with "Read more" and "Older
posts", where an article has one headline and its prose; a cart lists what is in it and
leads to checkout, where a checkout asks for address and payment; ``not_found`` is a 4xx
(the address is wrong or not allowed: do not retry) and ``server_error`` a 5xx (retry
later).
"""

from __future__ import annotations

from typing import Any

PAGE_TYPE_TEMPERATURE: float | None = 0.5514
"""The calibration of a choice over :data:`PAGE_TYPES` (all of them or a subset: its
``temperature``), fitted on screenshots by ``benchmarks/vision_page_type_calibration.py``."""

PAGE_TYPES: dict[str, dict[str, Any]] = {
    "login": {
        "description": "a sign-in page: a form with email or username and password fields and "
        "a sign-in button, often with a forgot-password link and a sign-up link",
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
            "Sign in to start your session\nEmail\nPassword\nRemember me\nSign in\n"
            "I forgot my password\nRegister a new account",
            "Hello again!\nEnter email address\nPassword\nLOGIN\nLogin with Google\n"
            "Login with Facebook\nForgot password?\nCreate an account",
            "Account login\nEmail address\nPassword\nKeep me signed in\nLog in\n"
            "Forgot your password?\nNew here? Create an account\n"
            "(layout: buttons: Log in; fields: Email address, Password)",
            "Sign in to your workspace\nEmail address\nname@company.com\nPassword\nSign in\n"
            "Forgot your password?\nNew to the app? Create an account",
            "Log in\nEmail\nPassword\nForgot password?\nLog in\nor\nSign in with Google\n"
            "Not a member yet? Sign up",
            "Sign in to Fabrikam\nUsername or email address\nPassword\nSign in\n"
            "Forgot your password?\nNew to Fabrikam? Create an account\n"
            "(layout: buttons: Sign in; fields: Username or email address, Password)",
            "Welcome back\nEmail\nname@example.com\nPassword\nForgot your password?\nSign in\n"
            "Don't have an account? Sign up for free",
        ],
    },
    "registration": {
        "description": "a sign-up page: a form to create a new account with name, email, "
        "password and repeat password fields",
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
            "Register a new membership\nFull name\nEmail\nPassword\nRetype password\n"
            "I agree to the terms\nRegister\nSign up using Google\nI already have a membership",
            "Create your account\nFirst Name\nLast Name\nEmail Address\nPassword\n"
            "Repeat Password\nRegister Account\nAlready have an account? Login!",
            "Sign Up\nEnter your name, email and password to register\nName\nEmail\nPassword\n"
            "I agree the Terms and Conditions\nSIGN UP\nAlready have an account? Sign in\n"
            "(layout: buttons: SIGN UP; fields: Name, Email, Password)",
            "Create an account!\nFirst name\nLast name\nEmail address\nPassword\n"
            "Repeat password\nSign up with Google\nSign up with Facebook\nForgot password?\n"
            "Already have an account? Log in",
            "Create an account\nSign up with\nGitHub\nGoogle\nOr sign up with credentials\nName\n"
            "Email\nPassword\nI agree with the Privacy Policy\nCreate account",
        ],
    },
    "password_reset": {
        "description": "a forgot-password or reset-password page: enter your email to get a "
        "reset link, or choose a new password; no sign-in password field",
        "examples": [
            "Forgot password?\nEnter your email and we'll send you a reset link\nEmail\nSend link",
            "Reset your password\nNew password\nConfirm new password\nReset password",
            "Password recovery\nWe will email you a link to reset your password\nSubmit\n"
            "Back to login",
            "Trouble signing in?\nEnter your username to receive a password reset email",
            "Passwort zurücksetzen\nNeues Passwort\nPasswort bestätigen\nSpeichern",
            "Mot de passe oublié\nRecevoir un lien de réinitialisation",
            "Check your email\nWe sent a password reset link to your inbox\nResend email",
            "Forgot your password?\nNo problem. Enter the email address of your account and we "
            "will send you instructions\nEmail address\nSend reset instructions\n"
            "Return to sign in",
            "You are one step away from your new password\nNew password\nRepeat new password\n"
            "Change password\nBack to login",
            "Recover your account\nEnter the email you signed up with\nEmail\n"
            "Email me a recovery link\nRemembered it? Log in\n"
            "(layout: buttons: Email me a recovery link; fields: Email)",
        ],
    },
    "not_found": {
        "description": "an HTTP 4xx error page: 404 page not found, 410 gone or 403 forbidden; "
        "the address is wrong or not allowed, retrying will not help",
        "examples": [
            "404\nPage not found\nThe page you are looking for doesn't exist\nGo home",
            "Oops! This page could not be found\nError 404\nBack to homepage",
            "404 Not Found\nThe requested URL was not found on this server",
            "Sorry, we can't find that page\nThe link may be broken or the page may have moved\n"
            "Return to the dashboard",
            "403 Forbidden\nYou don't have permission to access this resource",
            "410 Gone\nThis page has been removed",
            "Seite nicht gefunden\nFehler 404\nZur Startseite",
            "Page introuvable\nErreur 404\nRetour à l'accueil",
            "Lost in space?\n404\nNothing lives at this address\nTake me home\n"
            "(layout: headings: 404)",
        ],
    },
    "server_error": {
        "description": "an HTTP 5xx error page: 500 internal server error, 502 bad gateway, 503 "
        "service unavailable or down for maintenance; try again later",
        "examples": [
            "500 Internal Server Error\nSomething went wrong. Please try again later",
            "Error 500\nAn unexpected error occurred\nRequest ID",
            "502 Bad Gateway\nnginx",
            "503 Service Unavailable\nThe server is temporarily down for maintenance",
            "Oops! Something went wrong on our end\nWe are working on fixing it\nTry again",
            "We'll be back soon\nScheduled maintenance in progress\nCheck our status page",
            "504 Gateway Timeout\nThe server took too long to respond",
            "Interner Serverfehler\nBitte versuchen Sie es später erneut",
            "500\nServer error\nOur team has been notified\nRefresh the page\n"
            "(layout: headings: 500)",
            "503\nBe right back\nWe are doing some maintenance\nBack to home",
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
        "description": "a cookie wall: a cookie consent banner or privacy dialog asking to "
        "accept or reject cookies",
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
    "paywall": {
        "description": "a paywall: the article or content is locked and asks you to subscribe, "
        "pay or sign in to keep reading",
        "examples": [
            "Subscribe to continue reading\nYou have read 3 of 3 free articles this month\n"
            "Subscribe now\nAlready a subscriber? Sign in",
            "This article is for subscribers only\nGet unlimited access for $1 a week\n"
            "Start free trial\nCancel anytime",
            "Premium content\nUnlock this story\nBecome a member\nPlans from $4.99/month",
            "You've reached your limit of free articles\nSubscribe for full digital access",
            "Continue reading with a subscription\nMonthly\nAnnual\nSave 40%\nSubscribe",
            "Dieser Artikel ist nur für Abonnenten\nJetzt abonnieren\nBereits Abonnent? Anmelden",
            "Article réservé aux abonnés\nJe m'abonne\n1 € le premier mois",
            "Members only\nThe rest of this post is for paid subscribers\nUpgrade to paid\n"
            "(layout: buttons: Upgrade to paid)",
            "The Evening Post\nWhy house prices keep rising\nBy Ana Silva · June 2, 2024\n"
            "The first lines of the story are shown before the wall.\n"
            "Subscribe to keep reading\nYou have used all your free articles\nSubscribe now\n"
            "Already a subscriber? Log in",
            "City news\nA new bridge for the harbour\nThe council voted last night to fund the "
            "bridge.\nTo read the full story, create a free account or subscribe\n"
            "Register for free\nSee subscription offers",
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
            "Search\nType your keywords here\nResult title one\n2024-03-01\nsnippet of the "
            "matching text\nResult title two\nsnippet of the matching text\n1 2 3 Next",
            'Search results for "parking permit"\nShowing 1-10 of 58 results\nSort by '
            "relevance\nResident parking permits\nApply or renew a permit online.\n"
            "Visitor permits\nBuy a visitor permit for your street.",
            'Search the catalogue\nGo\nResults for "ocean"\n96 titles found\nSort by newest\n'
            "Title of a book\nAuthor name · 2020 · Available",
            "Search\nweekend hiking\nWeekend hiking trips for beginners\n2023-06-02 09:12am\n"
            "a snippet of the page that matched the words you typed\nBest hiking boots\n"
            "2023-05-28 04:40pm\nanother snippet that matched\n(layout: headings: Search; "
            "fields: weekend hiking)",
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
            "Products\n120 results\nFilter\nIn stock\nNew\nSale\nHoodie $49\nT-shirt $25\n"
            "Sneakers $89\nBackpack $59",
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
            "SKU: 10-442\nLeather weekend bag\n$180.00\nAvailable colors\nBrown Black\n"
            "Add to cart\nAdd to wishlist\nDescription\nReviews",
            "Canvas tote bag\nSKU: TB-210\n$32.00 $24.00\nA roomy bag made from heavy cotton "
            "canvas, with an inner pocket and long handles.\n1\nAdd to cart\nRelated products",
            "Pour-over kettle\nSKU: PK-07\n$64.00 $48.00\nA steel kettle with a thin spout for "
            "slow, even pouring.\nAdd to cart",
            "Icon set Pro\nDigital download\n4.8 · 95 reviews\n$29 $49\nLicense\nPersonal\n"
            "Commercial\nQuantity\nIn stock\nAdd to cart\nBuy now - $29\nInstant download\n"
            "Money-back guarantee\nDescription\nSpecifications\nReviews",
        ],
    },
    "cart": {
        "description": "a shopping cart or basket: the items added, quantities, subtotal and "
        "a proceed-to-checkout button",
        "examples": [
            "Shopping cart\nItem\nQuantity\nPrice\nSubtotal $58.00\nProceed to checkout",
            "Your bag (2 items)\nRemove\nEstimated shipping\nOrder total\nCheckout",
            "Your basket\nQty 2\nRemove\nPromo code\nApply\nBasket total\nGo to checkout",
            "Cart\n3 items\nUpdate cart\nContinue shopping\nSubtotal\nCheckout",
            "Warenkorb\nMenge\nEntfernen\nZwischensumme\nZur Kasse",
            "Panier\nQuantité\nSupprimer\nSous-total\nCommander",
            "Mi carrito\nCantidad\nEliminar\nSubtotal\nTramitar pedido",
            "Your cart (3)\nSubtotal $81.00\nShipping Free\nTax $6.48\nTotal $87.48\n"
            "Proceed to checkout\nContinue shopping",
        ],
    },
    "checkout": {
        "description": "a checkout page: shipping address, delivery, payment details and an "
        "order summary with a place-order or pay button",
        "examples": [
            "Checkout\nShipping address\nPayment method\nCard number\nExpiry date\nPlace order\n"
            "Order summary\nTotal",
            "Review your order\nDelivery options\nBilling address\nPay now",
            "Secure checkout\nContact information\nAddress\nCity\nPostcode\nContinue to payment",
            "Payment\nName on card\nCard number\nCVC\nPay $123.40",
            "Kasse\nLieferadresse\nZahlungsart\nJetzt kaufen",
            "Paiement\nAdresse de livraison\nMode de paiement\nValider la commande\nTotal TTC",
            "Finalizar compra\nDirección de envío\nMétodo de pago\nRealizar pedido",
        ],
    },
    "blog_index": {
        "description": "a blog's front page: a list of several post titles with dates, "
        "excerpts and read-more links",
        "examples": [
            "Blog\nLatest posts\nPost title one\nMarch 3, 2024\nA short excerpt of the post...\n"
            "Read more\nPost title two\nFebruary 20, 2024\nRead more\nOlder posts",
            "The team blog\nAll posts\nEngineering\nProduct\nTitle of a post\n5 min read\n"
            "Title of another post\n8 min read\nLoad more",
            "My travel journal\nRecent posts\nCategories\nPosted by Anna on June 1\n"
            "Posted by Anna on May 12\nContinue reading",
            "Welcome to my blog\nA personal blog about code\nFeatured post\nRead more\n"
            "Newer posts\nOlder posts\nSearch\nCategories\nArchives",
            "News\nArticles\nPage 1 of 12\nNext page",
            "Blog\nNeueste Beiträge\nWeiterlesen\nÄltere Beiträge",
            "The Daily Notebook\nA blog about design and code\nWhy small teams ship faster\n"
            "Notes from a year of shipping\nPosted by Sam on March 2, 2024\n"
            "A guide to better naming\nPosted by Sam on February 11, 2024\nOlder posts",
            "Recent articles\nHow to plant tomatoes\nApril 3, 2024 · 5 min read\nA short "
            "summary of the post.\nRead more\nWinter bike care\nMarch 18, 2024 · 7 min read\n"
            "Read more\nOur favourite trails\nMarch 2, 2024 · 3 min read\nRead more\n"
            "Older posts",
            "Harbour Notes\nA blog about boats and the sea\nWhy wooden hulls still matter\n"
            "What the old builders knew about oak\nPosted by Lena Falk on May 4, 2024\n"
            "(layout: headings: Harbour Notes)",
        ],
    },
    "blog_article": {
        "description": "one blog post or news article: its headline, author and date, then "
        "paragraphs of prose",
        "examples": [
            "Headline of the story\nBy Jane Smith · May 2, 2024 · 6 min read\nThe first paragraph "
            "of the article explains what happened and why it matters to readers.",
            "Blog\nPosted on March 14 by admin\nIn this post I want to share what we learned "
            "while building our new feature.\nComments\nShare",
            "Opinion\nWhy we need better public transport\nThe city has grown quickly and the "
            "buses have not kept up with it.",
            "Tutorial: getting started with gardening\nStep 1\nChoose a sunny spot\n"
            "Start with a small bed and add compost before planting.",
            "Von Max Müller · 3. Mai 2024\nDer Artikel beschreibt die Entwicklung der Stadt.",
            "Publié le 12 avril par la rédaction\nLa suite de l'article raconte notre voyage.",
            "How we moved to a new database\nPosted by the infrastructure team on June 3\n"
            "Last year our traffic doubled, and the old setup could no longer keep up.\n"
            "Leave a comment",
            "Company blog\nAll posts\nWhat we learned from a year of remote work\n"
            "Posted by Lee Park on 4 May 2024 · 12 comments\nWhen the office closed we had "
            "to rethink how the team shares news and makes decisions.\nThe first lesson",
            "Man walks on the moon\nA look back at the mission\nPosted by the editors on July 20"
            "\n(layout: headings: Man walks on the moon)",
            "Engineering blog\nHow we made our test suite three times faster\nPosted by Ana Ruiz "
            "on 3 March 2024 · 4 comments\nOur tests took 30 minutes on every pull request. This "
            "post walks through the profiling, the fixes and what did not work.\nWhat we measured "
            "first\nWe timed every step and graphed the results.",
            "A week by the sea\nPosted on June 9, 2024 by Mia Chen\nTravel\nFood\nThe ferry "
            "left at dawn, and by noon we had found a small house above the harbour.\nSearch\n"
            "Categories\nEvery morning we walked to the market and came back with more fish than "
            "we could eat.\nLeave a comment\nSide widget",
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
            "Dashboard\nEarnings (monthly)\n$40,000\nNew orders 150\nBounce rate 53%\n"
            "Sales overview\nRecent activity",
            "Dashboard\nNew tickets\n43\nClosed today\n17\nDaily earnings\n$95\n"
            "Development activity\nUSER\nCOMMIT\nDATE\nInitial commit\nMay 6, 2018\n"
            "Main structure\nApril 22, 2018",
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
            "Show 10 entries\nSearch:\nName\nRole\nCity\nJoined\nShowing 1 to 10 of 57 entries\n"
            "Previous 1 2 3 Next",
            "Members table\nMEMBER\nTEAM\nSTATUS\nJOINED\nAna Ruiz\nana@example.org\nDesign\n"
            "ACTIVE\n12/03/21\nEdit\nTom Berg\ntom@example.org\nSales\nAWAY\n04/11/22\nEdit\n"
            "Orders table\nORDER\nAMOUNT\nSTATUS\n#1024\n$120\nPAID\nEdit",
            "Customers table\nCUSTOMER\nAlice Moreau\nalice@example.com\nBen Ortiz\n"
            "ben@example.com\nCarla Diaz\ncarla@example.com\nPLAN\nPro\nFree\nTeam\nSTATUS\n"
            "ACTIVE\nPAUSED\nACTIVE\nSIGNED UP\n02/01/23\n14/05/22\n30/09/21\nEdit\nEdit\nEdit",
            "Tables\nDashboard / Tables\nProjects table\nPROJECT\nBUDGET\nSTATUS\nCOMPLETION\n"
            "Website redesign\n$2,500 USD\npending\n60%\nMobile app\n$1,800 USD\ncompleted\n"
            "100%\nPrevious\n1\n2\n3\nNext",
            "All Posts\nSearch\nTitle\nCategory\nAuthor\nCreated At\nStatus\n"
            "Getting started guide\nTutorial\nAnna\n2023-02-11\nPublished\nRelease notes\nNews\n"
            "Ben\n2023-02-09\nDraft\nEdit\nDelete",
        ],
    },
    "settings": {
        "description": "an account settings or user profile page: profile details, "
        "preferences, notifications and a save-changes button",
        "examples": [
            "Settings\nAccount\nProfile\nNotifications\nSecurity\nFull name\nEmail\nTime zone\n"
            "Save changes",
            "Edit profile\nProfile picture\nUpload\nRemove\nDisplay name\nBio\nUpdate profile",
            "Account settings\nChange password\nTwo-factor authentication\nDelete account",
            "Preferences\nLanguage\nTheme\nDark mode\nEmail notifications\nSave",
            "My profile\nAbout me\nLocation\nFollowers 320\nFollowing 41\nEdit profile",
            "Billing\nPayment methods\nInvoices\nBilling information\nPlan: Pro\nManage plan",
            "Billing\nPayment method\nAdd new card\n**** **** **** 4242\nExpires 08/27\nInvoices\n"
            "View all\nMarch 1, 2024\n#INV-1042\n$49.00\nPDF\nBilling information\n"
            "Company name\nEmail address\nEdit\nDelete\nYour transactions",
            "User profile\nJane Cooper\nProduct designer\nFollowers 1,204\nFollowing 310\n"
            "Activity\nTimeline\nSettings\nAbout me\nEducation\nLocation\nSkills\nFollow\n"
            "Send message",
            "Account\nUpdate your personal information\nProfile picture\nUpload new\nRemove\n"
            "Full name\nEmail address\nRole\nTime zone\nNotifications\nPrivacy and security\n"
            "Appearance\nCancel\nSave changes",
            "Einstellungen\nProfil\nBenachrichtigungen\nÄnderungen speichern",
            "Paramètres du compte\nProfil\nMot de passe\nEnregistrer",
            "General Settings\nSite title\nSite description\nSite logo\nChoose file\nBrowse\n"
            "Time zone\nLanguage\nSave changes",
        ],
    },
}
"""Page type → ``{"description", "examples"}`` (a ready-made ``Choice`` criteria mapping)."""
