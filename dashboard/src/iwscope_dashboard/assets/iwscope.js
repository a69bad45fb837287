/* iwscope dashboard: keep the filter state in the address bar, and carry it across pages. */
window.dash_clientside = Object.assign({}, window.dash_clientside, {
    iwscope: {
        /* The page's data callback stores "?campaign=...&base=3..." after each filter change;
           replaceState updates the shareable URL without reloading or re-routing the page. */
        syncQuery: function (search) {
            if (typeof search !== "string") {
                return window.dash_clientside.no_update;
            }
            if (window.location.search !== search) {
                window.history.replaceState(window.history.state, "", window.location.pathname + search + window.location.hash);
            }
            return search;
        },
        /* The Trials page: once the inspector shows a trial (a click on a row far up the table, or a
           link with trial=<id>), bring it into view. */
        revealInspector: function (note) {
            var inspector = document.getElementById("trials-inspector");
            if (!note || !inspector) {
                return window.dash_clientside.no_update;
            }
            inspector.scrollIntoView({block: "start"});
            return true;
        }
    }
});

/* Navigation links marked data-keep-query take the current filters along. */
document.addEventListener("click", function (event) {
    var link = event.target.closest ? event.target.closest("a[data-keep-query]") : null;
    if (!link) {
        return;
    }
    var target = new URL(link.getAttribute("href"), window.location.href);
    link.setAttribute("href", target.pathname + window.location.search);
}, true);
