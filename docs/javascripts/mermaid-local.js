// Mermaid from the site itself (javascripts/vendor/mermaid, mermaid 11 from npm), loaded only on a page that has a
// diagram. Material for MkDocs uses a global `mermaid` when one is defined, and else fetches it from a CDN, which an
// offline reader (an air-gapped cluster) cannot reach: this stands in for it, and loads the real one on the first
// diagram (3.5 MB, so not on every page).
(function () {
  const src = new URL("vendor/mermaid/mermaid.min.js", document.currentScript.src).href;
  let options = {};
  let loading = null;
  const load = () =>
    loading ||
    (loading = new Promise((resolve, reject) => {
      const script = document.createElement("script");
      script.src = src;
      script.onload = () => {
        window.mermaid.initialize(options);
        resolve(window.mermaid);
      };
      script.onerror = () => reject(new Error("mermaid could not be loaded from " + src));
      document.head.appendChild(script);
    }));
  window.mermaid = {
    initialize(given) {
      options = given;
    },
    async render(id, text, container) {
      return (await load()).render(id, text, container);
    },
  };
})();
