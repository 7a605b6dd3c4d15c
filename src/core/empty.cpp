// Placeholder so a component with no sources yet still forms a library.
namespace rd { int rd_empty_component_marker = 0; }
